"""Python models end to end: a real agent, real worker processes, tritonclient over HTTP."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.backends.python.backend import PythonBackend
from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.repository.model_config import load_model_config
from agent.runtime.daemon import RunningAgent
from tests.models import FLAT_CONFIG, IDENTITY_TYPES, flat_model, write_model
from tests.python_models import (
    ADD_SUB_CONFIG,
    ADD_SUB_MODEL,
    ARGS_MODEL,
    BAD_INIT_MODEL,
    BEHAVIOUR_MODEL,
    ECHO_MODEL,
    NO_CLASS_MODEL,
    SLOPPY_MODEL,
    STUCK_FINALIZE_MODEL,
    args_config,
    behaviour_config,
    echo_config,
    minimal_config,
    write_python_model,
)
from tests.server import running_agent
from tests.support import wait_until

WAIT_S = 30.0


# Answers Y = X and echoes the request's id, parameters and correlation id as response
# parameters (Triton's `InferenceResponse(parameters=...)`).
CONTEXT_MODEL = """
import json

from agent import pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            params = {
                "id": request.request_id(),
                "asked": request.parameters(),
                "corrid": request.correlation_id(),
            }
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)], parameters=params)
            )
        return responses
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python")
    repo = root / "models"
    write_model(repo, "flat", flat_model(), FLAT_CONFIG)
    write_python_model(repo, "add_sub", ADD_SUB_MODEL, ADD_SUB_CONFIG)
    write_python_model(repo, "echo_all", ECHO_MODEL, echo_config())
    (root / "meeting").mkdir()
    write_python_model(repo, "args", ARGS_MODEL, args_config(root / "meeting"))
    write_python_model(repo, "flaky", BEHAVIOUR_MODEL, behaviour_config("flaky"))
    write_python_model(repo, "hang", BEHAVIOUR_MODEL, behaviour_config("hang", timeout_s=2))
    write_python_model(
        repo, "hang_late", BEHAVIOUR_MODEL, behaviour_config("hang_late", timeout_s=10)
    )
    write_python_model(
        repo, "hang_queue", BEHAVIOUR_MODEL, behaviour_config("hang_queue", timeout_s=8)
    )
    write_python_model(repo, "exit3", BEHAVIOUR_MODEL, behaviour_config("exit3"))
    write_python_model(repo, "kill9", BEHAVIOUR_MODEL, behaviour_config("kill9"))
    marker = root / "finalized.txt"
    write_python_model(repo, "fin", BEHAVIOUR_MODEL, behaviour_config("fin", marker=marker))
    write_python_model(repo, "bad_init", BAD_INIT_MODEL, minimal_config("bad_init"))
    write_python_model(repo, "no_class", NO_CLASS_MODEL, minimal_config("no_class"))
    bad_import = (
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        import edge_agent_no_such_module\n"
    )
    write_python_model(repo, "bad_import", bad_import, minimal_config("bad_import"))
    write_python_model(
        repo, "no_inputs", ADD_SUB_MODEL, minimal_config("no_inputs", with_inputs=False)
    )
    write_python_model(repo, "sloppy", SLOPPY_MODEL, minimal_config("sloppy"))
    write_python_model(repo, "context", CONTEXT_MODEL, minimal_config("context"))
    cached = minimal_config("context_cached") + "response_cache { enable: true }"
    write_python_model(repo, "context_cached", CONTEXT_MODEL, cached)
    sequences = minimal_config("context_seq") + "sequence_batching { }"
    write_python_model(repo, "context_seq", CONTEXT_MODEL, sequences)
    timeout = minimal_config("bad_timeout") + (
        'parameters { key: "execute_timeout_seconds" value { string_value: "soon" } }'
    )
    write_python_model(repo, "bad_timeout", ADD_SUB_MODEL, timeout)
    stuck = ADD_SUB_CONFIG.replace('"add_sub"', '"stuck_fin"') + (
        'parameters { key: "finalize_timeout_seconds" value { string_value: "1" } }'
    )
    write_python_model(repo, "stuck_fin", STUCK_FINALIZE_MODEL, stuck)
    return repo


@pytest.fixture(scope="module")
def agent(repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
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
    # The client is not thread-safe: concurrent requests go through its own async_infer.
    c = httpclient.InferenceServerClient(
        f"127.0.0.1:{agent.http_port}", network_timeout=60, concurrency=16
    )
    yield c
    c.close()


def worker_pids(agent: RunningAgent, model: str) -> tuple[int, ...]:
    served = next(m for m in agent.registry.served_models() if m.name == model)
    backend = served.versions[1].backend
    assert isinstance(backend, PythonBackend)
    return backend.worker_pids


def gone(pids: tuple[int, ...]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def index_row(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    rows = [r for r in client.get_model_repository_index() if r["name"] == model]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def infer_x(client: httpclient.InferenceServerClient, model: str, value: float) -> np.ndarray:
    x = np.full((2, 1), value, dtype=np.float32)
    inp = httpclient.InferInput("X", [2, 1], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    y: np.ndarray | None = result.as_numpy("Y")
    assert y is not None
    return y


def assert_others_serve(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput("X", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("flat", [inp]).as_numpy("Y"), x * 2)
    np.testing.assert_array_equal(infer_x(client, "flaky", 5.0), np.full((2, 1), 10.0))


def test_add_sub_outputs_equal_numpy(client: httpclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3, 4], "FP32")]
    inputs.append(httpclient.InferInput("INPUT1", [3, 4], "FP32"))
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    meta = client.get_model_metadata("add_sub")
    assert [[int(d) for d in i["shape"]] for i in meta["inputs"]] == [[-1, 4], [-1, 4]]


def test_concurrent_requests_get_their_own_rows_back(
    client: httpclient.InferenceServerClient,
) -> None:
    pending = []
    for i in range(16):
        a = np.full((1, 4), i, dtype=np.float32)
        inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a * 10)
        pending.append((a * 11, client.async_infer("add_sub", inputs)))
    for expected, call in pending:
        np.testing.assert_array_equal(call.get_result().as_numpy("OUTPUT0"), expected)
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert int(stats["inference_count"]) >= 16


def test_every_datatype_round_trips(client: httpclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(1)
    inputs, sent = [], {}
    for kind in IDENTITY_TYPES:
        if kind == "BYTES":
            data = np.array([[b"a", b"", "\u00e9t\u00e9".encode()], [b"\x00\xff", b"x", b"yz"]])
            data = data.astype(np.object_)
        elif kind == "BOOL":
            data = rng.integers(0, 2, (2, 3)).astype(bool)
        else:
            data = (rng.random((2, 3)) * 100).astype(np.dtype(kind.lower().replace("fp", "float")))
        inp = httpclient.InferInput(f"IN_{kind}", [2, 3], kind)
        inp.set_data_from_numpy(data)
        inputs.append(inp)
        sent[kind] = data
    result = client.infer("echo_all", inputs)
    for kind, data in sent.items():
        got = result.as_numpy(f"OUT_{kind}")
        assert got is not None
        assert got.shape == data.shape, kind
        if kind == "BYTES":
            assert got.tolist() == data.tolist()
        else:
            assert got.dtype == data.dtype, kind
            np.testing.assert_array_equal(got, data)


def meet_async(client: httpclient.InferenceServerClient, wanted: int) -> Any:
    inp = httpclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([wanted], dtype=np.int32))
    return client.async_infer("args", [inp])


def meet(client: httpclient.InferenceServerClient, wanted: int) -> dict[str, Any]:
    return answer(meet_async(client, wanted).get_result())


def answer(result: httpclient.InferResult) -> dict[str, Any]:
    args = result.as_numpy("ARGS")
    pid, met = result.as_numpy("PID"), result.as_numpy("MET")
    assert args is not None
    assert pid is not None
    assert met is not None
    return {"args": json.loads(args[0]), "pid": int(pid[0]), "met": int(met[0])}


def test_the_model_reads_the_request_context_and_answers_response_parameters(
    client: httpclient.InferenceServerClient,
) -> None:
    inp = httpclient.InferInput("X", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))

    result = client.infer("context", [inp], request_id="r-1", parameters={"s": "v", "i": 3})
    plain = client.infer("context", [inp])

    response = result.get_response()
    assert response["id"] == "r-1"
    assert response["parameters"] == {"id": "r-1", "asked": '{"s": "v", "i": 3}', "corrid": 0}
    assert plain.get_response()["parameters"] == {"id": "", "asked": "{}", "corrid": 0}


def test_a_response_cache_hit_answers_the_parameters_the_model_answered_the_miss_with(
    client: httpclient.InferenceServerClient,
) -> None:
    inp = httpclient.InferInput("X", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full((1, 1), 7.0, dtype=np.float32))

    miss = client.infer("context_cached", [inp], request_id="r-1")
    hit = client.infer("context_cached", [inp], request_id="r-2")

    stats = client.get_inference_statistics("context_cached")["model_stats"][0]
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
    assert hit.get_response()["id"] == "r-2"  # the request's own id, the model's parameters
    assert hit.get_response()["parameters"] == miss.get_response()["parameters"]
    assert miss.get_response()["parameters"]["id"] == "r-1"
    assert hit.as_numpy("Y").tolist() == [[7.0]]


def test_a_sequence_s_model_reads_its_correlation_id(
    client: httpclient.InferenceServerClient,
) -> None:
    inp = httpclient.InferInput("X", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))

    first = client.infer("context_seq", [inp], sequence_id=42, sequence_start=True)
    last = client.infer("context_seq", [inp], sequence_id=42, sequence_end=True)

    for result in (first, last):
        assert result.get_response()["parameters"] == {"id": "", "asked": "{}", "corrid": 42}


def test_initialize_args(
    client: httpclient.InferenceServerClient, agent: RunningAgent, repo: Path
) -> None:
    args = meet(client, 1)["args"]
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_name"] == "args"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] in {"args_0_0", "args_0_1"}
    assert Path(args["model_repository"]) == repo / "args"
    config = json.loads(args["model_config"])
    assert config["name"] == "args"
    assert config["backend"] == "python"
    assert [i["name"] for i in config["input"]] == ["X"]
    assert [o["name"] for o in config["output"]] == ["ARGS", "PID", "MET"]
    assert config["instance_group"][0]["count"] == 2


def test_two_instances_run_in_two_worker_processes(
    client: httpclient.InferenceServerClient, agent: RunningAgent
) -> None:
    pids = worker_pids(agent, "args")
    assert len(set(pids)) == 2
    assert os.getpid() not in pids
    for pid in pids:
        assert psutil.Process(pid).ppid() == os.getpid()
    meeting = agent.registry.repository.parent / "meeting"
    for left in meeting.iterdir():
        left.unlink()
    # Each request waits inside execute until two workers are in it: only two processes
    # running at the same time let both requests meet.
    calls = [meet_async(client, 2) for _ in range(2)]
    answers = [answer(c.get_result()) for c in calls]
    assert all(a["met"] >= 2 for a in answers)
    assert {a["pid"] for a in answers} == set(pids)
    names = {a["args"]["model_instance_name"] for a in answers}
    assert names == {"args_0_0", "args_0_1"}


def test_execute_raising_fails_only_that_request(
    client: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as raised:
        infer_x(client, "flaky", -1.0)
    assert raised.value.status() == "500"
    assert "ValueError: negative input" in str(raised.value)
    assert client.is_model_ready("flaky")
    np.testing.assert_array_equal(infer_x(client, "flaky", 2.0), np.full((2, 1), 4.0))


def test_error_response_fails_only_that_request(
    client: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as raised:
        infer_x(client, "flaky", 1.0)
    assert raised.value.status() == "500"
    assert "one is not allowed" in str(raised.value)
    assert client.is_model_ready("flaky")
    np.testing.assert_array_equal(infer_x(client, "flaky", 2.0), np.full((2, 1), 4.0))


def restarted(agent: RunningAgent, model: str, old: tuple[int, ...]) -> tuple[int, ...]:
    """The new workers of `model`, once its instance is back (bounded)."""

    def new() -> tuple[int, ...]:
        pids = worker_pids(agent, model)
        return pids if pids and set(pids).isdisjoint(old) else ()

    return wait_until(new, f"{model} restarted", timeout_s=WAIT_S)


def test_hung_execute_kills_the_worker_and_a_new_one_serves(
    client: httpclient.InferenceServerClient, agent: RunningAgent
) -> None:
    pids = worker_pids(agent, "hang")
    np.testing.assert_array_equal(infer_x(client, "hang", 2.0), np.full((2, 1), 4.0))
    with pytest.raises(InferenceServerException) as raised:
        infer_x(client, "hang", 7.0)
    reason = (
        f"python model 'hang' instance 0 hung: no response within 2 s; worker (pid {pids[0]}) "
        "killed"
    )
    assert raised.value.status() == "500"
    assert reason in str(raised.value)
    wait_until(lambda: gone(pids), f"worker {pids} ended", timeout_s=WAIT_S)
    # No operator action: the instance is started again (initialize runs again) and serves.
    new = restarted(agent, "hang", pids)
    wait_until(lambda: client.is_model_ready("hang"), "hang ready again")
    assert index_row(client, "hang")["state"] == "READY"
    result = infer_x(client, "hang", 2.0)
    np.testing.assert_array_equal(result, np.full((2, 1), 4.0))
    assert_others_serve(client)
    assert worker_pids(agent, "hang") == new


def test_a_fast_python_model_never_runs_on_the_event_loop(
    client: httpclient.InferenceServerClient,
) -> None:
    """Many quick runs first (tiny ONNX models move onto the loop after a few), then a hang:
    the agent keeps answering other requests while the Python worker is stuck."""
    for _ in range(12):
        np.testing.assert_array_equal(infer_x(client, "hang_late", 2.0), np.full((2, 1), 4.0))
    x = np.full((2, 1), 7.0, dtype=np.float32)
    inp = httpclient.InferInput("X", [2, 1], "FP32")
    inp.set_data_from_numpy(x)
    stuck = client.async_infer("hang_late", [inp])
    assert client.is_server_live()
    assert_others_serve(client)
    assert client.is_model_ready("hang_late")  # the stuck request has not been answered yet
    with pytest.raises(InferenceServerException) as raised:
        stuck.get_result()
    assert "no response within 10 s" in str(raised.value)


def test_requests_queued_behind_a_hang_go_to_the_new_worker(
    client: httpclient.InferenceServerClient, agent: RunningAgent
) -> None:
    def request(value: float) -> list[httpclient.InferInput]:
        inp = httpclient.InferInput("X", [2, 1], "FP32")
        inp.set_data_from_numpy(np.full((2, 1), value, dtype=np.float32))
        return [inp]

    pids = worker_pids(agent, "hang_queue")
    stuck = client.async_infer("hang_queue", request(7.0))
    queued = [client.async_infer("hang_queue", request(2.0)) for _ in range(3)]
    with pytest.raises(InferenceServerException) as first:
        stuck.get_result()
    assert first.value.status() == "500"
    assert "python model 'hang_queue' instance 0 hung: no response within 8 s" in str(first.value)
    # The requests behind it waited for the restart (within execute_timeout_seconds) and were
    # answered by the new worker.
    for pending in queued:
        result = pending.get_result()
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((2, 1), 4.0))
        pid = result.as_numpy("PID")
        assert pid is not None
        assert int(pid[0, 0]) not in pids


@pytest.mark.parametrize(
    ("model", "value", "how"), [("exit3", 3.0, "exited with code 3"), ("kill9", 9.0, "signal 9")]
)
def test_a_worker_that_dies_in_execute_is_replaced(
    client: httpclient.InferenceServerClient,
    agent: RunningAgent,
    model: str,
    value: float,
    how: str,
) -> None:
    pids = worker_pids(agent, model)
    with pytest.raises(InferenceServerException) as raised:
        infer_x(client, model, value)
    assert raised.value.status() == "500"
    assert f"python model '{model}' instance 0 worker (pid {pids[0]}) " in str(raised.value)
    assert how in str(raised.value)
    restarted(agent, model, pids)
    wait_until(lambda: client.is_model_ready(model), f"{model} ready again")
    np.testing.assert_array_equal(infer_x(client, model, 2.0), np.full((2, 1), 4.0))
    assert index_row(client, model)["state"] == "READY"
    assert gone(pids)
    assert_others_serve(client)


def test_load_failures_report_the_reason(client: httpclient.InferenceServerClient) -> None:
    bad = index_row(client, "bad_init")
    assert bad["state"] == "UNAVAILABLE"
    assert "model.py" in bad["reason"]
    assert "RuntimeError: no weights here" in bad["reason"]
    no_class = index_row(client, "no_class")
    assert "model.py" in no_class["reason"]
    assert "defines no class TritonPythonModel" in no_class["reason"]
    # Raised by the model: Triton's words, the status code, the error and the model's frames.
    assert bad["reason"].startswith("Internal: RuntimeError: no weights here\n\nAt:\n  ")
    assert "bad_init/1/model.py(" in bad["reason"]
    # The model's frames alone (none of the worker's), relative to the repository.
    assert index_row(client, "bad_import")["reason"] == (
        "Internal: ModuleNotFoundError: No module named 'edge_agent_no_such_module'\n\n"
        "At:\n  bad_import/1/model.py(3): initialize\n"
    )
    # A model that declares no input loads, as in Triton (one may take none, a generator).
    assert index_row(client, "no_inputs")["state"] == "READY"
    bad_timeout = index_row(client, "bad_timeout")
    assert "parameters execute_timeout_seconds must be a positive number" in bad_timeout["reason"]
    with pytest.raises(InferenceServerException, match="no weights here"):
        client.load_model("bad_init")
    assert_others_serve(client)


def test_unload_runs_finalize_and_ends_the_workers(
    client: httpclient.InferenceServerClient, agent: RunningAgent, repo: Path
) -> None:
    marker = repo.parent / "finalized.txt"
    first = worker_pids(agent, "fin")
    np.testing.assert_array_equal(infer_x(client, "fin", 2.0), np.full((2, 1), 4.0))
    client.load_model("fin")  # reload: a new build replaces the old one
    second = worker_pids(agent, "fin")
    assert set(second).isdisjoint(first)
    assert gone(first)
    assert marker.read_text().splitlines() == [f"finalized {first[0]}"]
    np.testing.assert_array_equal(infer_x(client, "fin", 3.5), np.full((2, 1), 7.0))
    client.unload_model("fin")
    assert gone(second)
    assert marker.read_text().splitlines() == [f"finalized {p}" for p in (*first, *second)]
    assert not client.is_model_ready("fin")


def test_outputs_unlike_the_config_are_answered_as_triton_answers_them(
    client: httpclient.InferenceServerClient,
) -> None:
    # Another datatype: the array as the model made it (Triton's Python backend does the same).
    y = infer_x(client, "sloppy", 2.0)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.full((2, 1), 2.0))
    # Too few rows for the batch: refused, saying what was expected.
    with pytest.raises(InferenceServerException) as wrong_rows:
        infer_x(client, "sloppy", 5.0)
    assert "output 'Y' has shape [1, 1], expected [2, 1]" in str(wrong_rows.value)
    assert client.is_model_ready("sloppy")


def test_unload_ends_a_worker_stuck_in_finalize(
    client: httpclient.InferenceServerClient, agent: RunningAgent
) -> None:
    pids = worker_pids(agent, "stuck_fin")
    client.unload_model("stuck_fin")
    assert gone(pids)
    assert not client.is_model_ready("stuck_fin")
    assert_others_serve(client)


KINDS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args, model_dir=pb_utils.get_model_dir())

    def execute(self, requests):
        text = np.array([json.dumps(self.args).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", text)]) for _ in requests]
"""

KINDS_CONFIG = """
name: "kinds"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [
  { name: "on_gpu" kind: KIND_GPU gpus: [ 1 ] },
  { name: "on_model" kind: KIND_MODEL }
]
"""


def test_gpu_and_model_instance_args_as_triton_passes_them_without_a_gpu(tmp_path: Path) -> None:
    # Only the args are checked: the worker touches no GPU, so none is needed here.
    model_dir = write_python_model(tmp_path, "kinds", KINDS_MODEL, KINDS_CONFIG)
    config = load_model_config(model_dir)
    assert config is not None
    backend = PythonBackend(model_dir / "1", config, model_name="kinds", version=1)
    try:
        seen = {}
        for _ in range(2):  # a free worker each time: one of each group
            (out,) = backend.run({"X": np.array([1], dtype=np.int32)}, ["ARGS"])
            args = json.loads(out[0])
            seen[args["model_instance_name"]] = args
    finally:
        backend.close()
    assert set(seen) == {"on_gpu_0", "on_model_0"}
    gpu, model = seen["on_gpu_0"], seen["on_model_0"]
    assert (gpu["model_instance_kind"], gpu["model_instance_device_id"]) == ("GPU", "1")
    assert (model["model_instance_kind"], model["model_instance_device_id"]) == ("MODEL", "0")
    assert gpu["model_dir"] == str(model_dir / "1")  # pb_utils.get_model_dir(): its version folder
    assert gpu["model_repository"] == str(model_dir)
