"""Stateful models end to end: tritonclient over gRPC streaming and HTTP, both strategies,
idle release, the backlog, Triton's errors, and a sequence that spans a hot swap."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent import pb_utils
from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.scheduling.sequence_scheduler import SequenceScheduler
from bench.sequence_models import ACCUMULATOR_CONFIG, accumulator_model
from tests.models import write_model
from tests.python_models import write_python_model
from tests.server import running_agent
from tests.support import wait_until

STRATEGIES = {
    "direct": "direct { max_queue_delay_microseconds: 200 }",
    "oldest": "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 200"
    " preferred_batch_size: [ 2, 4 ] }",
}
IDLE_US = 300_000
SEQUENCE_IDLE_US = 2_000_000
BACKLOG_WAIT_US = 30_000_000  # a START's wait for a slot, beyond the idle time on a busy host
ABANDONED = {1048, 1049}  # the last sequence of two workers never ends: it idles out

ENSEMBLE = """
name: "acc_ensemble" platform: "ensemble" max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step { model_name: "acc_oldest" model_version: -1
  input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "SUM" } } }
"""

# A Python model that keeps its own sums per CORRID, as Triton users write stateful Python models.
PY_SOURCE = """
import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().flat[0])
            total = (0.0 if start.flat[0] else self.sums[corrid]) + float(x.flat[0])
            self.sums[corrid] = total
            out = pb_utils.Tensor("OUTPUT", np.full(x.shape, total, np.float32))
            echo = pb_utils.Tensor("CORRID_OUT", np.full(x.shape, corrid, np.uint64))
            responses.append(pb_utils.InferenceResponse([out, echo]))
        return responses
"""
PY_CONFIG = """
name: "py_acc" backend: "python" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""

# A BLS model that runs the stateful ONNX accumulator as a sequence of its own: Triton's
# `correlation_id=` and `flags=` on the BLS request.
BLS_SOURCE = """
import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            corrid = int(pb_utils.get_input_tensor_by_name(request, "ID").as_numpy().flat[0])
            flags = int(pb_utils.get_input_tensor_by_name(request, "FLAGS").as_numpy().flat[0])
            answer = pb_utils.InferenceRequest(
                model_name="acc_direct",
                requested_output_names=["OUTPUT"],
                inputs=[pb_utils.Tensor("INPUT", x.as_numpy())],
                correlation_id=corrid,
                flags=flags,
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
"""
BLS_CONFIG = """
name: "bls_acc" backend: "python" max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "ID" data_type: TYPE_UINT64 dims: [ 1 ] },
        { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# A decoupled Python model under the sequence batcher: per request, two responses (the running
# sum, then ten times it), then the final flag alone.
STREAM_SOURCE = """
import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().flat[0])
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().flat[0]
            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().flat[0])
            total = (0.0 if start else self.sums[corrid]) + x
            self.sums[corrid] = total
            sender = request.get_response_sender()
            for value in (total, 10 * total):
                out = pb_utils.Tensor("OUTPUT", np.array([[value]], np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
STREAM_CONFIG = """
name: "py_stream_acc" backend: "python" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
sequence_batching {
  direct { max_queue_delay_microseconds: 1000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("sequence") / "models"
    for strategy, block in STRATEGIES.items():
        config = ACCUMULATOR_CONFIG.format(
            name=f"acc_{strategy}", strategy=block, idle_us=SEQUENCE_IDLE_US
        )
        write_model(repo, f"acc_{strategy}", accumulator_model(), config)
    one_slot = ACCUMULATOR_CONFIG.format(
        name="acc_idle", strategy=STRATEGIES["direct"], idle_us=IDLE_US
    ).replace("max_batch_size: 4", "max_batch_size: 1")
    write_model(repo, "acc_idle", accumulator_model(), one_slot)
    swap = ACCUMULATOR_CONFIG.format(name="acc_swap", strategy=STRATEGIES["oldest"], idle_us=10**7)
    write_model(repo, "acc_swap", accumulator_model(1.0), swap, versions=(1,))
    write_model(repo, "acc_swap", accumulator_model(2.0), None, versions=(2,))
    write_python_model(repo, "py_acc", PY_SOURCE, PY_CONFIG)
    write_python_model(repo, "bls_acc", BLS_SOURCE, BLS_CONFIG)
    write_python_model(repo, "py_stream_acc", STREAM_SOURCE, STREAM_CONFIG)
    (repo / "acc_ensemble" / "1").mkdir(parents=True)
    (repo / "acc_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    settings = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    with running_agent(settings) as running:
        yield running


def value(v: float, cls: Any) -> Any:
    tensor = cls("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[v]], np.float32))
    return tensor


def http_sequences(
    port: int, model: str, sequences: list[tuple[int, list[float]]]
) -> dict[int, list[float]]:
    """Each sequence in turn over HTTP; a START may wait for another worker's slot."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    out: dict[int, list[float]] = {}
    try:
        for corrid, values in sequences:
            sums = []
            for i, v in enumerate(values):
                result = client.infer(
                    model,
                    [value(v, httpclient.InferInput)],
                    sequence_id=corrid,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1 and corrid not in ABANDONED,
                    timeout=BACKLOG_WAIT_US,
                )
                assert int(result.as_numpy("CORRID_OUT")[0, 0]) == corrid
                sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
            out[corrid] = sums
    finally:
        client.close()
    return out


def grpc_sequences(
    port: int, model: str, sequences: list[tuple[int, list[float]]]
) -> dict[int, list[float]]:
    """Each sequence's requests sent at once on one stream, the answers read back in order."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    out: dict[int, list[float]] = {}
    try:
        for corrid, values in sequences:
            for i, v in enumerate(values):
                client.async_stream_infer(
                    model,
                    [value(v, grpcclient.InferInput)],
                    sequence_id=corrid,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1 and corrid not in ABANDONED,
                    timeout=BACKLOG_WAIT_US,
                )
            sums = []
            for _ in values:
                answer = answers.get(timeout=60)
                if isinstance(answer, Exception):
                    raise answer
                assert int(answer.as_numpy("CORRID_OUT")[0, 0]) == corrid
                sums.append(float(answer.as_numpy("OUTPUT")[0, 0]))
            out[corrid] = sums
    finally:
        client.stop_stream()
        client.close()
    return out


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_fifty_interleaved_sequences_match_numpy(agent: RunningAgent, strategy: str) -> None:
    rng = np.random.default_rng(7)
    sequences = [
        (1000 + n, [float(x) for x in rng.integers(-9, 10, size=rng.integers(2, 7))])
        for n in range(50)
    ]
    assert agent.grpc_port is not None
    model = f"acc_{strategy}"
    scheduler = scheduler_of(agent, model)
    # Eight workers on four slots, and the four slots taken when they start: their STARTs wait.
    holder = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    for corrid in range(1, 5):
        assert infer(holder, model, corrid, sequence_id=corrid, sequence_start=True) == corrid
    workers = [
        partial(grpc_sequences, agent.grpc_port)
        if w % 2
        else partial(http_sequences, agent.http_port)
        for w in range(8)
    ]
    with ThreadPoolExecutor(len(workers)) as pool:
        futures = [
            pool.submit(work, model, sequences[w :: len(workers)]) for w, work in enumerate(workers)
        ]
        wait_until(lambda: scheduler.waiting_sequences >= 1, "STARTs waiting for a slot")
        for corrid in range(1, 5):
            assert infer(holder, model, 1.0, sequence_id=corrid, sequence_end=True) == corrid + 1
        got: dict[int, list[float]] = {}
        for future in futures:
            got.update(future.result(timeout=120))
    for corrid, values in sequences:
        assert got[corrid] == np.cumsum(np.array(values, np.float32)).tolist(), corrid
    wait_until(lambda: scheduler.live_sequences == 0, "abandoned sequences idled out")
    assert scheduler.state_bytes == 0
    with pytest.raises(InferenceServerException, match="released after 2000000 us idle"):
        infer(holder, model, 1.0, sequence_id=1048)
    holder.close()


def scheduler_of(agent: RunningAgent, model: str, version: str | None = None) -> SequenceScheduler:
    served, number = agent.registry.resolve(model, version)
    scheduler = served.versions[number].scheduler
    assert isinstance(scheduler, SequenceScheduler)
    return scheduler


def infer(client: httpclient.InferenceServerClient, model: str, v: float, **kw: Any) -> float:
    result = client.infer(model, [value(v, httpclient.InferInput)], **kw)
    return float(result.as_numpy("OUTPUT")[0, 0])


def test_idle_sequence_frees_its_slot_for_a_waiting_one(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    scheduler = scheduler_of(agent, "acc_idle")
    assert infer(client, "acc_idle", 1.0, sequence_id=101, sequence_start=True) == 1.0
    other = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")  # one per thread
    with ThreadPoolExecutor(1) as pool:  # the only slot is taken: this START waits
        waiting = pool.submit(infer, other, "acc_idle", 5.0, sequence_id=102, sequence_start=True)
        wait_until(lambda: scheduler.waiting_sequences == 1, "sequence 102 in the backlog")
        assert waiting.result(timeout=30) == 5.0  # 101 idled out and gave its slot to 102
    with pytest.raises(InferenceServerException, match="released after 300000 us idle"):
        infer(client, "acc_idle", 1.0, sequence_id=101)
    assert infer(client, "acc_idle", 2.0, sequence_id=102, sequence_end=True) == 7.0
    client.close()
    other.close()


def test_start_that_finds_no_slot_in_its_timeout_gets_503(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    assert infer(client, "acc_idle", 3.0, sequence_id=201, sequence_start=True) == 3.0
    with pytest.raises(InferenceServerException) as caught:
        infer(client, "acc_idle", 1.0, sequence_id=202, sequence_start=True, timeout=20_000)
    assert caught.value.status() == "503"
    assert "timeout of the corresponding sequence has been expired" in str(caught.value)
    assert infer(client, "acc_idle", 1.0, sequence_id=201, sequence_end=True) == 4.0
    client.close()


def test_tritons_errors(agent: RunningAgent) -> None:
    assert agent.grpc_port is not None
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    x = [value(1.0, grpcclient.InferInput)]
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first"):
        client.infer("acc_direct", x, sequence_id=77)
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        client.infer("acc_direct", x)
    with pytest.raises(
        InferenceServerException,
        match="control 'CORRID' data-type is 'BYTES', but model 'acc_direct' expects 'UINT64'",
    ):
        client.infer("acc_direct", x, sequence_id="abc", sequence_start=True)
    two = grpcclient.InferInput("INPUT", [2, 1], "FP32")
    two.set_data_from_numpy(np.ones((2, 1), np.float32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1"):
        client.infer("acc_direct", [two], sequence_id=78, sequence_start=True)
    client.close()


def load(port: int, model: str, config: dict[str, Any]) -> int:
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/repository/models/{model}/load", data=body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        status: int = resp.status
    return status


def test_sequence_spans_a_hot_swap_and_ends_on_its_version(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")

    def step(corrid: int, v: float, **kw: Any) -> tuple[str, float]:
        result = client.infer(
            "acc_swap", [value(v, httpclient.InferInput)], sequence_id=corrid, **kw
        )
        response = result.get_response()
        return str(response["model_version"]), float(result.as_numpy("OUTPUT")[0, 0])

    assert step(301, 1.0, sequence_start=True) == ("1", 1.0)
    config = agent.dataplane.model_config("acc_swap", None)
    config["version_policy"] = {"specific": {"versions": [2]}}
    old = scheduler_of(agent, "acc_swap")
    with ThreadPoolExecutor(1) as pool:
        swap = pool.submit(load, agent.http_port, "acc_swap", config)
        wait_until(lambda: client.is_model_ready("acc_swap", "2") or swap.done(), "version 2")
        assert not swap.done()  # loaded, and version 1 drains until its last sequence ends
        assert step(302, 1.0, sequence_start=True) == ("2", 2.0)  # new sequences: new version
        assert step(301, 2.0) == ("1", 3.0)  # the live one stays on version 1
        assert old.live_sequences == 1
        assert step(301, 3.0, sequence_end=True) == ("1", 6.0)
        assert swap.result(timeout=60) == 200
    assert step(302, 1.0, sequence_end=True) == ("2", 4.0)
    client.close()


def test_an_ensemble_passes_the_sequence_to_its_stateful_step(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")

    def step(corrid: int, v: float, **kw: Any) -> float:
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[v]], np.float32))
        result = client.infer("acc_ensemble", [x], sequence_id=corrid, **kw)
        return float(result.as_numpy("SUM")[0, 0])

    assert step(401, 1.0, sequence_start=True) == 1.0
    assert step(402, 5.0, sequence_start=True) == 5.0
    assert step(401, 2.0) == 3.0
    assert step(402, 5.0, sequence_end=True) == 10.0
    assert step(401, 3.0, sequence_end=True) == 6.0
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(401, 1.0)
    client.close()


def test_a_python_model_gets_each_sequence_request_with_its_own_controls(
    agent: RunningAgent,
) -> None:
    rng = np.random.default_rng(11)
    sequences = [(500 + n, [float(x) for x in rng.integers(1, 9, size=4)]) for n in range(12)]
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(http_sequences, agent.http_port, "py_acc", sequences[w::4])
            for w in range(4)
        ]
        got: dict[int, list[float]] = {}
        for future in futures:
            got.update(future.result(timeout=120))
    for corrid, values in sequences:
        assert got[corrid] == np.cumsum(np.array(values, np.float32)).tolist(), corrid


def test_bls_requests_carry_their_correlation_id_and_flags(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    start, end = (
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    )

    def step(corrid: int, v: float, flags: int) -> float:
        inputs = [
            httpclient.InferInput("X", [1, 1], "FP32"),
            httpclient.InferInput("ID", [1, 1], "UINT64"),
            httpclient.InferInput("FLAGS", [1, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.array([[v]], np.float32))
        inputs[1].set_data_from_numpy(np.array([[corrid]], np.uint64))
        inputs[2].set_data_from_numpy(np.array([[flags]], np.int32))
        return float(client.infer("bls_acc", inputs).as_numpy("SUM")[0, 0])

    assert step(601, 1.0, start) == 1.0
    assert step(602, 4.0, start) == 4.0
    assert step(601, 2.0, 0) == 3.0
    assert step(602, 4.0, end) == 8.0
    assert step(601, 3.0, end) == 6.0
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(601, 1.0, 0)  # the sequence ended: the called model's own error comes back
    client.close()


def test_a_decoupled_model_under_the_sequence_batcher_streams_each_request(
    agent: RunningAgent,
) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    messages: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: messages.put(error or result))

    def step(corrid: int, v: float, **flags: bool) -> list[Any]:
        client.async_stream_infer(
            "py_stream_acc",
            [value(v, grpcclient.InferInput)],
            sequence_id=corrid,
            enable_empty_final_response=True,
            **flags,
        )
        got: list[Any] = []
        while True:
            message = messages.get(timeout=30)
            if isinstance(message, InferenceServerException):
                return [*got, message.message()]
            out = message.as_numpy("OUTPUT")
            if out is not None:
                got.append(float(out.flat[0]))
            if message.get_response().parameters["triton_final_response"].bool_param:
                return got

    try:
        assert step(701, 1.0, sequence_start=True) == [1.0, 10.0]
        assert step(702, 5.0, sequence_start=True) == [5.0, 50.0]
        assert step(701, 2.0) == [3.0, 30.0]
        assert step(701, 3.0, sequence_end=True) == [6.0, 60.0]
        assert step(702, 1.0, sequence_end=True) == [6.0, 60.0]
        (error,) = step(701, 1.0)  # the sequence ended: Triton's error, on the stream
        assert "must specify the START flag" in error
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
