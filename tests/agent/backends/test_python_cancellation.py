"""BLS calls and cancellation: abandoned results never block the pipe, and a BLS child request is
cancelled when its caller stops waiting (the model's asyncio task, the parent's client, the
parent's execute timeout), as in Triton; `request.is_cancelled()` says so inside the model.

A real agent (HTTP and gRPC, tritonclient). The models meet through marker files in one folder:
the child writes `<token>.started`, then loops until `is_cancelled()` and writes
`<token>.cancelled` (or `<token>.finished` if nobody cancelled it within a minute).
"""

from __future__ import annotations

import json
import queue
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.python_models import write_python_model
from tests.server import http_client, running_agent
from tests.support import wait_until

# TOKEN (BYTES [1]) names the marker files; OUT echoes it. Polls `is_cancelled()` at most a
# minute (a bound for a broken agent, not a timing the test relies on).
CHILD_MODEL = """
import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.markers = Path(config["parameters"]["markers"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            token = pb_utils.get_input_tensor_by_name(request, "TOKEN").as_numpy()
            name = token[0].decode()
            (self.markers / (name + ".started")).touch()
            deadline = time.monotonic() + 60
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.005)
            if request.is_cancelled():
                (self.markers / (name + ".cancelled")).touch()
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            (self.markers / (name + ".finished")).touch()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", token)]))
        return responses
"""

# MODE 0: start a child call in a task, cancel the task once the child runs.
# MODE 1: await a child call (the client cancels this request meanwhile); then write
#         `<token>.parent_cancelled` if `is_cancelled()` says so.
# MODE 2: start a child call, never await it, then hang (the execute times out).
PARENT_MODEL = """
import asyncio
import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.markers = Path(config["parameters"]["markers"]["string_value"])

    async def execute(self, requests):
        responses = []
        for request in requests:
            token = pb_utils.get_input_tensor_by_name(request, "TOKEN")
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            name = token.as_numpy()[0].decode()
            child = pb_utils.InferenceRequest(
                model_name="child", requested_output_names=["OUT"], inputs=[token]
            )
            if mode == 0:
                task = asyncio.ensure_future(child.async_exec())
                started = self.markers / (name + ".started")
                for _ in range(6000):
                    if started.exists():
                        break
                    await asyncio.sleep(0.01)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            elif mode == 1:
                answer = await child.async_exec()
                if request.is_cancelled():
                    (self.markers / (name + ".parent_cancelled")).touch()
            else:
                child.async_exec()
                time.sleep(3600)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", token.as_numpy())]))
        return responses
"""

# Fires three BLS calls whose multi-MB results it never awaits, then answers a multi-MB output
# itself: both sides write large messages at once.
DROPPER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            for _ in range(3):
                pb_utils.InferenceRequest(
                    model_name="big", requested_output_names=["Y"], inputs=[x]
                ).async_exec()
            y = np.full(BIG, float(x.as_numpy()[0]), dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
""".replace("BIG", str(2 * 1024 * 1024))  # 8 MB of FP32

BIG_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            y = np.full(BIG, x, dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
""".replace("BIG", str(2 * 1024 * 1024))


def _config(name: str, markers: Path, io: str, *, count: int = 1, timeout_s: int = 30) -> str:
    return f"""
name: "{name}"
backend: "python"
{io}
instance_group [{{ kind: KIND_CPU count: {count} }}]
parameters {{ key: "markers" value {{ string_value: "{markers}" }} }}
parameters {{ key: "execute_timeout_seconds" value {{ string_value: "{timeout_s}" }} }}
"""


TOKEN_IO = """
input [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PARENT_IO = """
input [
  { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
BIG_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("cancel") / "models"
    # Two child instances: a cancelled child that kept running would hold one, not the test.
    write_python_model(repo, "child", CHILD_MODEL, _config("child", markers, TOKEN_IO, count=2))
    write_python_model(repo, "parent", PARENT_MODEL, _config("parent", markers, PARENT_IO))
    hang = _config("parent_hang", markers, PARENT_IO, timeout_s=2)
    write_python_model(repo, "parent_hang", PARENT_MODEL, hang)
    dropper = _config("dropper", markers, BIG_IO, timeout_s=5)  # a deadlock fails fast
    write_python_model(repo, "dropper", DROPPER_MODEL, dropper)
    write_python_model(repo, "big", BIG_MODEL, _config("big", markers, BIG_IO))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    with http_client(agent) as c:
        yield c


def _parent_inputs(module: Any, token: str, mode: int) -> list[Any]:
    inputs = [module.InferInput("TOKEN", [1], "BYTES"), module.InferInput("MODE", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([token.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([mode], dtype=np.int32))
    return inputs


def test_abandoned_multi_mb_bls_results_never_block_the_worker(
    client: httpclient.InferenceServerClient,
) -> None:
    for i in range(8):
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([float(i)], dtype=np.float32))
        y = client.infer("dropper", [x]).as_numpy("Y")
        assert y is not None
        assert y.shape == (2 * 1024 * 1024,)
        assert float(y[0]) == float(i)
    assert client.is_model_ready("dropper")  # its worker was neither stuck nor killed
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([5.0], dtype=np.float32))
    y = client.infer("big", [x]).as_numpy("Y")
    assert y is not None
    assert float(y[-1]) == 5.0


def test_cancelling_the_task_awaiting_async_exec_cancels_the_child(
    client: httpclient.InferenceServerClient, markers: Path
) -> None:
    result = client.infer("parent", _parent_inputs(httpclient, "task", 0))
    assert result.as_numpy("OUT").tolist() == [b"task"]
    wait_until((markers / "task.cancelled").exists, "the child to see is_cancelled()")
    assert not (markers / "task.finished").exists()


def test_a_client_cancelling_the_parent_cancels_its_bls_child(
    agent: RunningAgent, markers: Path
) -> None:
    answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}") as grpc:
        call = grpc.async_infer(
            "parent",
            _parent_inputs(grpcclient, "client", 1),
            callback=lambda result, error: answers.put((result, error)),
        )
        wait_until((markers / "client.started").exists, "the child to start")
        call.cancel()
        _, error = answers.get(timeout=30)
    assert error is not None
    assert "cancel" in str(error).lower()
    wait_until((markers / "client.cancelled").exists, "the child to be cancelled")
    wait_until(
        (markers / "client.parent_cancelled").exists,
        "the parent to read is_cancelled() True",
    )
    assert not (markers / "client.finished").exists()


def test_an_execute_timeout_cancels_the_bls_child(
    client: httpclient.InferenceServerClient, markers: Path
) -> None:
    with pytest.raises(InferenceServerException, match="hung: no response within 2 s"):
        client.infer("parent_hang", _parent_inputs(httpclient, "hang", 2))
    wait_until((markers / "hang.cancelled").exists, "the child to be cancelled")
    assert not (markers / "hang.finished").exists()


def _open_infer(port: int, token: str) -> socket.socket:
    """Send a raw HTTP /infer for `child` and return the connection without reading."""
    body = json.dumps(
        {"inputs": [{"name": "TOKEN", "shape": [1], "datatype": "BYTES", "data": [token]}]}
    ).encode()
    head = (
        f"POST /v2/models/child/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head + body)
    return sock


def test_an_http_client_that_disconnects_cancels_its_request(
    agent: RunningAgent, markers: Path
) -> None:
    assert agent.http_port is not None
    served, number = agent.registry.resolve("child", None)
    stats = served.versions[number].stats

    def pending() -> int:  # requests whose callers wait, queued or running
        return stats.snapshot().pending

    # Both child instances busy with requests whose clients then wait ...
    running = [_open_infer(agent.http_port, f"http_running_{i}") for i in range(2)]
    for i in range(2):
        wait_until((markers / f"http_running_{i}.started").exists, "the request to run")
    # ... a third one queues; its client goes away: the scheduler skips it (never runs it).
    queued = _open_infer(agent.http_port, "http_queued")
    wait_until(lambda: pending() == 3, "the third request to queue")
    queued.close()
    wait_until(lambda: pending() == 2, "the queued request's caller to be gone")
    for sock in running:  # the running ones see is_cancelled() turn true
        sock.close()
    for i in range(2):
        wait_until((markers / f"http_running_{i}.cancelled").exists, "is_cancelled() in the model")
        assert not (markers / f"http_running_{i}.finished").exists()
    scheduler = served.versions[number].scheduler
    wait_until(lambda: scheduler.pending == 0, "the scheduler to empty its queue")
    assert not (markers / "http_queued.started").exists()
