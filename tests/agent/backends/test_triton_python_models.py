"""Python models written for Triton, unchanged: a real agent, tritonclient over HTTP.

`import triton_python_backend_utils as pb_utils`, `TritonModelException`, `Logger` (to the
agent's log with the model's name), `auto_complete_config` with and without batching, and a
config.pbtxt without a `backend:` line.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent import pb_utils
from agent.backends.select import BackendKind, backend_kind
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import load_model_config
from agent.runtime.daemon import RunningAgent
from tests.python_models import (
    CLASHING_MODEL,
    REQUEST_COUNT_CONFIG,
    REQUEST_COUNT_MODEL,
    RETURNS_NOTHING_MODEL,
    triton_auto_model,
    write_python_model,
)
from tests.server import explicit_agent, http_client


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_python") / "models"
    write_python_model(repo, "batch_auto", triton_auto_model(4), 'name: "batch_auto"\n')
    write_python_model(repo, "nobatch_auto", triton_auto_model(0), "")
    write_python_model(
        repo, "bad_batch", triton_auto_model(4), 'name: "bad_batch"\nmax_batch_size: 8\n'
    )
    write_python_model(
        repo,
        "bad_input",
        CLASHING_MODEL,
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n',
    )
    write_python_model(repo, "returns_nothing", RETURNS_NOTHING_MODEL, "")
    write_python_model(repo, "count", REQUEST_COUNT_MODEL, REQUEST_COUNT_CONFIG)
    return repo


@pytest.fixture(scope="module")
def log_lines() -> Iterator[list[str]]:
    handler = _Collect()
    target = logging.getLogger("agent.backends.python.backend")
    level = target.level
    target.setLevel(logging.DEBUG)  # the agent's own setting decides in service; here: all
    target.addHandler(handler)
    yield handler.lines
    target.removeHandler(handler)
    target.setLevel(level)


@pytest.fixture(scope="module")
def agent(repo: Path, log_lines: list[str]) -> Iterator[RunningAgent]:
    with explicit_agent(repo) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    with http_client(agent) as c:
        yield c


def add_sub(
    client: httpclient.InferenceServerClient, model: str, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0"),
        httpclient.InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer(model, inputs, outputs=outputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def index_row(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    rows = [r for r in client.get_model_repository_index() if r["name"] == model]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def test_auto_completed_batching_model_serves(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("batch_auto")
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    out0, out1 = add_sub(client, "batch_auto", a, b)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    config = client.get_model_config("batch_auto")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]


def test_auto_completed_model_without_batching(client: httpclient.InferenceServerClient) -> None:
    a = np.full(4, 3, dtype=np.float32)
    b = np.full(4, 1, dtype=np.float32)
    out0, out1 = add_sub(client, "nobatch_auto", a, b)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    config = client.get_model_config("nobatch_auto")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config


def _counts(client: httpclient.InferenceServerClient, model: str) -> tuple[int, ...]:
    """(success, fail, execution_count, inference_count) of the model's statistics."""
    [s] = client.get_inference_statistics(model)["model_stats"]
    inference = s["inference_stats"]
    return tuple(
        int(v)
        for v in (
            inference["success"]["count"],
            inference["fail"]["count"],
            s["execution_count"],
            s["inference_count"],
        )
    )


def test_triton_model_exception_fails_the_request(
    client: httpclient.InferenceServerClient,
) -> None:
    a = np.full((1, 4), -1, dtype=np.float32)
    before = _counts(client, "batch_auto")
    with pytest.raises(InferenceServerException, match="INPUT0 must not be negative"):
        add_sub(client, "batch_auto", a, a)
    assert client.is_model_ready("batch_auto")
    # As Triton: a failure, and an execution whose row is no inference.
    after = _counts(client, "batch_auto")
    assert [n - b for n, b in zip(after, before, strict=True)] == [0, 1, 1, 0]


def test_logger_lines_reach_the_agent_log_with_the_model_name(
    client: httpclient.InferenceServerClient, repo: Path, log_lines: list[str]
) -> None:
    a = np.zeros((1, 4), dtype=np.float32)
    add_sub(client, "batch_auto", a, a)
    with pytest.raises(InferenceServerException):
        add_sub(client, "batch_auto", a - 1, a)
    mine = [line for line in log_lines if "python model batch_auto " in line]
    assert any(line.endswith("initialized batch_auto on CPU") for line in mine), mine
    assert any(f"via log() {repo / 'batch_auto' / '1'}" in line for line in mine), mine
    assert any("model.py:" in line and "execute (1, 4)" in line for line in mine), mine
    assert any(line.endswith("negative INPUT0") for line in mine), mine
    pb_utils.Logger.log_verbose("not from a worker")  # outside a worker: stderr, no error


def test_auto_complete_errors_make_the_model_unavailable(
    client: httpclient.InferenceServerClient,
) -> None:
    bad = index_row(client, "bad_batch")
    assert bad["state"] == "UNAVAILABLE"
    assert (
        "ValueError: configuration specified max_batch_size 8, but in auto-complete-config "
        "function for model 'bad_batch' specified max_batch_size 4"
    ) in bad["reason"]
    clash = index_row(client, "bad_input")
    assert clash["state"] == "UNAVAILABLE"
    assert (
        "unable to load model 'bad_input', configuration expects datatype TYPE_INT32 for input "
        "'INPUT0', model provides TYPE_FP32"
    ) in clash["reason"]
    nothing = index_row(client, "returns_nothing")
    assert nothing["state"] == "UNAVAILABLE"
    assert (
        "auto_complete_config function in model 'returns_nothing' must return a valid "
        "pb.ModelConfig object."
    ) in nothing["reason"]
    assert client.is_model_ready("batch_auto")


def test_a_dynamic_batch_reaches_execute_as_separate_requests(agent: RunningAgent) -> None:
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{agent.http_port}", network_timeout=60, concurrency=8
    )
    before = _counts(client, "count")
    try:
        pending = []
        for k in range(4):
            x = np.full((k + 1, 2), -1.0 if k == 2 else float(k), dtype=np.float32)
            item = httpclient.InferInput("X", list(x.shape), "FP32")
            item.set_data_from_numpy(x)
            pending.append((x, client.async_infer("count", [item])))
        counts = []
        for k, (x, request) in enumerate(pending):
            if k == 2:  # its error response fails this request only
                with pytest.raises(InferenceServerException, match="negative X"):
                    request.get_result()
                continue
            result = request.get_result()
            np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
            count = result.as_numpy("COUNT")
            assert count.shape == (k + 1, 1)
            counts.append(int(count[0, 0]))
        after = _counts(client, "count")
    finally:
        client.close()
    # Requests of different row counts share one execute call, each its own InferenceRequest.
    assert max(counts) > 1, counts
    # As Triton: a request the model answered with an error response is a success too.
    success, fail, _, rows = (n - b for n, b in zip(after, before, strict=True))
    assert (success, fail, rows) == (4, 0, 1 + 2 + 3 + 4)


def test_an_empty_config_is_served_as_a_python_model(agent: RunningAgent) -> None:
    # nobatch_auto's config.pbtxt is empty: model.py makes it Python, auto-complete the rest.
    served = next(m for m in agent.registry.served_models() if m.name == "nobatch_auto")
    assert served.config.backend == "python"
    assert served.config.platform == ""
    assert [i.name for i in served.config.input] == ["INPUT0", "INPUT1"]


def test_triton_module_name_is_agent_pb_utils() -> None:
    import triton_python_backend_utils

    assert triton_python_backend_utils is pb_utils
    assert issubclass(pb_utils.TritonModelException, Exception)
    assert pb_utils.Logger.LogLevel is pb_utils.LogLevel
    assert pb_utils.Logger.INFO is pb_utils.LogLevel.INFO


def test_model_py_without_backend_line_is_a_python_model(tmp_path: Path) -> None:
    write_python_model(tmp_path, "m", "", 'name: "m"\n')
    config = load_model_config(tmp_path / "m")
    assert config is not None
    assert config.backend == "python"
    assert backend_kind(mc.ModelConfig(), tmp_path / "m" / "1") is BackendKind.PYTHON
    assert backend_kind(mc.ModelConfig()) is BackendKind.ONNXRUNTIME
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"")
    assert backend_kind(mc.ModelConfig(), tmp_path / "m" / "1") is BackendKind.ONNXRUNTIME
    onnx = load_model_config(tmp_path / "m")
    assert onnx is not None
    assert onnx.backend == ""


def _config(**fields: Any) -> pb_utils.ModelConfig:
    doc: dict[str, Any] = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    doc.update(fields)
    return pb_utils.ModelConfig(json.dumps(doc))


def test_model_config_setters_follow_triton() -> None:
    config = _config()
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
    config.set_model_transaction_policy({"decoupled": False})
    doc = config.as_dict()
    assert doc["max_batch_size"] == 8
    assert doc["dynamic_batching"] == {}
    assert doc["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [2], "optional": True}]
    assert doc["model_transaction_policy"] == {"decoupled": False}
    # The same definition again completes the existing entry instead of adding one.
    declared = _config(input=[{"name": "X", "data_type": "TYPE_INVALID", "dims": []}])
    declared.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
    assert declared.as_dict()["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]}),
            "model 'm', tensor 'X': the model expects dims [3] but the model configuration "
            "specifies dims [2]",
        ),
        (
            lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
            "output 'Y' in auto-complete-config function for model 'm' contains property other "
            "than 'name', 'data_type' and 'dims'.",
        ),
        (
            lambda c: c.add_input({"name": "Z", "dims": [1]}),
            "input 'Z' in auto-complete-config function for model 'm' is missing 'data_type' "
            "property.",
        ),
        (
            lambda c: c.set_max_batch_size(2),
            "configuration specified max_batch_size 4, but in auto-complete-config function for "
            "model 'm' specified max_batch_size 2",
        ),
        (
            lambda c: c.set_model_transaction_policy({"decoupled": True}),
            "trying to change decoupled property in auto-complete-config for model 'm', which is "
            "already set to 'False'.",
        ),
        (
            lambda c: c.set_model_transaction_policy({"other": 1}),
            "model transaction property in auto-complete-config function for model 'm' contains "
            "property other than 'decoupled'.",
        ),
    ],
)
def test_model_config_refuses_as_triton(call: Any, message: str) -> None:
    config = _config(
        max_batch_size=4,
        input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        model_transaction_policy={"decoupled": False},
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(config)


def test_dynamic_batching_refused_beside_sequence_batching() -> None:
    config = _config(sequence_batching={})
    with pytest.raises(ValueError, match="tries to set scheduling_choice as 'dynamic_batching'"):
        config.set_dynamic_batching()


def test_bytes_and_type_code_helpers_follow_triton() -> None:
    tensor = np.array([[b"ab", b""], ["\u00e9", 7]], dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(tensor)
    assert serialized is not None
    assert serialized.dtype == np.object_
    raw = serialized.item()
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x007"
    assert pb_utils.deserialize_bytes_tensor(raw).tolist() == [b"ab", b"", b"\xc3\xa9", b"7"]
    empty = pb_utils.serialize_byte_tensor(np.empty([0], dtype=np.object_))
    assert empty is not None
    assert empty.size == 0
    assert pb_utils.serialize_byte_tensor(np.zeros(2, dtype=np.float32)) is None
    with pytest.raises(ValueError, match="truncated"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(99) is None
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.bool_) == 1
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    for code in range(1, 13):
        assert pb_utils.numpy_to_triton_type(pb_utils.triton_to_numpy_type(code)) == code


def test_triton_error_codes_and_request_cancellation_flag() -> None:
    error = pb_utils.TritonError("stop", pb_utils.TritonError.CANCELLED)
    assert (error.message(), error.code()) == ("stop", 7)
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    request = pb_utils.InferenceRequest([], ["Y"])
    assert request.is_cancelled() is False
    request.set_cancelled()
    assert request.is_cancelled() is True
