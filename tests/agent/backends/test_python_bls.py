"""BLS: Python models run other models from `execute` through the agent's own data plane.

A real agent and tritonclient over HTTP. `bls_sync` / `bls_async` are copies, written to the same
API, of Triton's published BLS example (`exec`, and `async def execute` with `async_exec` and
`asyncio.gather`), calling an ONNX add/sub model; `sync_client` drives them the way Triton's
example client does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from agent import pb_utils
from agent.runtime.daemon import RunningAgent
from tests.models import add_sub_model, scale_model, write_model, write_versions
from tests.python_models import write_python_model
from tests.server import explicit_agent, http_client

BLS_SYNC_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            # A BYTES element: bytes, which InferenceRequest accepts as Triton's does.
            model_name_string = model_name.as_numpy()[0]
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name_string,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            responses.append(
                pb_utils.InferenceResponse(output_tensors=infer_response.output_tensors())
            )
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

BLS_ASYNC_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            awaits = []
            for model_name in ["add_sub", "add_sub_py"]:
                infer_request = pb_utils.InferenceRequest(
                    model_name=model_name,
                    requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=[in_0, in_1],
                )
                awaits.append(infer_request.async_exec())
            inference_responses = await asyncio.gather(*awaits)
            for infer_response in inference_responses:
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
            out0 = pb_utils.get_output_tensor_by_name(inference_responses[0], "OUTPUT0")
            out1 = pb_utils.get_output_tensor_by_name(inference_responses[1], "OUTPUT1")
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
"""

BLS_CONFIG = """
name: "{name}"
backend: "python"
input [
  {{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
instance_group [{{ kind: KIND_CPU }}]
"""

ASYNC_CONFIG = """
name: "bls_async"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

ADD_SUB_ONNX_CONFIG = """
name: "add_sub"
platform: "onnxruntime_onnx"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

ADD_SUB_PY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                )
            )
        return responses
"""

# X (FP32 [1, 4]) through model "scaled", version VERSION (-1: the policy's), as Y.
VERSION_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            version = int(pb_utils.get_input_tensor_by_name(request, "VERSION").as_numpy()[0])
            response = pb_utils.InferenceRequest(
                model_name="scaled", requested_output_names=["Y"], inputs=[x],
                model_version=version,
            ).exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(response, "Y")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.as_numpy())]))
        return responses
"""

VERSION_CONFIG = """
name: "bls_version"
backend: "python"
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "VERSION" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""

# DEPTH > 0: calls itself with DEPTH - 1 (TIMEOUT_US its BLS timeout, 0: none); ERROR is the
# inner call's error message, or empty.
SELF_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            depth = pb_utils.get_input_tensor_by_name(request, "DEPTH")
            timeout = int(pb_utils.get_input_tensor_by_name(request, "TIMEOUT_US").as_numpy()[0])
            error = b""
            if int(depth.as_numpy()[0]) > 0:
                inner = pb_utils.InferenceRequest(
                    model_name=self.name,
                    requested_output_names=["ERROR"],
                    inputs=[
                        pb_utils.Tensor("DEPTH", depth.as_numpy() - 1),
                        pb_utils.Tensor("TIMEOUT_US", np.array([0], dtype=np.int64)),
                    ],
                    timeout=timeout,
                ).exec()
                if inner.has_error():
                    error = inner.error().message().encode()
            out = np.array([error], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ERROR", out)]))
        return responses
"""


def self_config(name: str, count: int) -> str:
    return f"""
name: "{name}"
backend: "python"
input [
  {{ name: "DEPTH" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "TIMEOUT_US" data_type: TYPE_INT64 dims: [ 1 ] }}
]
output [ {{ name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [{{ kind: KIND_CPU count: {count} }}]
parameters {{ key: "execute_timeout_seconds" value {{ string_value: "2" }} }}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("bls") / "models"
    write_model(repo, "add_sub", add_sub_model(), ADD_SUB_ONNX_CONFIG)
    write_python_model(
        repo,
        "add_sub_py",
        ADD_SUB_PY_MODEL,
        ADD_SUB_ONNX_CONFIG.replace(
            'name: "add_sub"\nplatform: "onnxruntime_onnx"', 'name: "add_sub_py"\nbackend: "python"'
        ),
    )
    write_python_model(repo, "bls_sync", BLS_SYNC_MODEL, BLS_CONFIG.format(name="bls_sync"))
    write_python_model(repo, "bls_async", BLS_ASYNC_MODEL, ASYNC_CONFIG)
    write_versions(repo, "scaled", {1: scale_model(1.0), 2: scale_model(3.0)})
    write_python_model(repo, "bls_version", VERSION_MODEL, VERSION_CONFIG)
    write_python_model(repo, "self1", SELF_MODEL, self_config("self1", 1))
    write_python_model(repo, "self2", SELF_MODEL, self_config("self2", 2))
    return repo


@pytest.fixture(scope="module")
def agent(repo: Path) -> Iterator[RunningAgent]:
    with explicit_agent(repo) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    with http_client(agent) as c:
        yield c


def sync_client(url: str) -> list[str]:
    """Triton's BLS sync example client, step by step: add_sub, then an undefined model."""
    printed: list[str] = []
    shape = [4]
    with httpclient.InferenceServerClient(url) as client:
        input0_data = np.random.rand(*shape).astype(np.float32)
        input1_data = np.random.rand(*shape).astype(np.float32)
        inputs = [
            httpclient.InferInput(
                "INPUT0", input0_data.shape, np_to_triton_dtype(input0_data.dtype)
            ),
            httpclient.InferInput(
                "INPUT1", input1_data.shape, np_to_triton_dtype(input1_data.dtype)
            ),
            httpclient.InferInput("MODEL_NAME", [1], np_to_triton_dtype(np.object_)),
        ]
        inputs[0].set_data_from_numpy(input0_data)
        inputs[1].set_data_from_numpy(input1_data)
        inputs[2].set_data_from_numpy(np.array(["add_sub"], dtype=np.object_))
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0"),
            httpclient.InferRequestedOutput("OUTPUT1"),
        ]
        response = client.infer("bls_sync", inputs, request_id=str(1), outputs=outputs)
        output0_data = response.as_numpy("OUTPUT0")
        output1_data = response.as_numpy("OUTPUT1")
        if not np.allclose(input0_data + input1_data, output0_data):
            sys.exit("BLS sync example error: incorrect sum")
        if not np.allclose(input0_data - input1_data, output1_data):
            sys.exit("BLS sync example error: incorrect difference")
        printed.append("add_sub ok")
        try:
            inputs[2].set_data_from_numpy(np.array(["undefined_model"], dtype=np.object_))
            client.infer("bls_sync", inputs, request_id=str(1), outputs=outputs)
        except InferenceServerException as e:
            printed.append(str(e.message()))
        printed.append("PASS: BLS Sync")
    return printed


def add_sub(
    client: httpclient.InferenceServerClient, model: str, a: np.ndarray, b: np.ndarray, **extra: str
) -> tuple[np.ndarray, np.ndarray]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    for name, value in extra.items():
        tensor = httpclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def inference_count(client: httpclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(int(s.get("inference_count", 0)) for s in stats)


def test_triton_sync_example_client(agent: RunningAgent) -> None:
    printed = sync_client(f"127.0.0.1:{agent.http_port}")
    assert printed[0] == "add_sub ok"
    assert (
        "Model undefined_model - Error when running inference: "
        "Failed for execute the inference request. Model 'undefined_model' is not ready."
        in (printed[1])
    )
    assert printed[-1] == "PASS: BLS Sync"


def test_exec_equals_direct_call_and_is_counted(client: httpclient.InferenceServerClient) -> None:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([0.5, 0.5, 2, 8], dtype=np.float32)
    direct = add_sub(client, "add_sub", a, b)
    before = inference_count(client, "add_sub")
    via_bls = add_sub(client, "bls_sync", a, b, MODEL_NAME="add_sub")
    np.testing.assert_array_equal(via_bls[0], direct[0])
    np.testing.assert_array_equal(via_bls[1], direct[1])
    assert inference_count(client, "add_sub") == before + 1


def test_async_exec_with_gather(client: httpclient.InferenceServerClient) -> None:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    before = (inference_count(client, "add_sub"), inference_count(client, "add_sub_py"))
    out0, out1 = add_sub(client, "bls_async", a, b)
    np.testing.assert_array_equal(out0, add_sub(client, "add_sub", a, b)[0])
    np.testing.assert_array_equal(out1, a - b)
    after = (inference_count(client, "add_sub"), inference_count(client, "add_sub_py"))
    assert after == (before[0] + 2, before[1] + 1)  # + the direct call above


def test_unknown_model_fails_that_request_only(client: httpclient.InferenceServerClient) -> None:
    a = np.ones(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as raised:
        add_sub(client, "bls_sync", a, a, MODEL_NAME="no_such_model")
    assert "Model 'no_such_model' is not ready" in str(raised.value.message())
    assert client.is_model_ready("bls_sync")
    np.testing.assert_array_equal(add_sub(client, "bls_sync", a, a, MODEL_NAME="add_sub")[0], a + a)


def _scaled(client: httpclient.InferenceServerClient, version: int) -> np.ndarray:
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    inputs = [
        httpclient.InferInput("X", [1, 4], "FP32"),
        httpclient.InferInput("VERSION", [1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([version], dtype=np.int32))
    result: np.ndarray = client.infer("bls_version", inputs).as_numpy("Y")
    return result


def test_model_version_selection(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    np.testing.assert_array_equal(_scaled(client, 1), x * 1.0)
    np.testing.assert_array_equal(_scaled(client, 2), x * 3.0)
    np.testing.assert_array_equal(_scaled(client, -1), x * 3.0)  # the latest READY version
    stats = client.get_inference_statistics("scaled", "1")["model_stats"]
    assert int(stats[0]["inference_count"]) >= 1
    with pytest.raises(InferenceServerException, match="scaled"):
        _scaled(client, 7)
    assert client.is_model_ready("bls_version")


def _self_call(client: httpclient.InferenceServerClient, model: str, timeout_us: int) -> str:
    inputs = [
        httpclient.InferInput("DEPTH", [1], "INT32"),
        httpclient.InferInput("TIMEOUT_US", [1], "INT64"),
    ]
    inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([timeout_us], dtype=np.int64))
    out = client.infer(model, inputs).as_numpy("ERROR")
    return bytes(out[0]).decode()


def test_self_call_with_a_free_instance_runs(client: httpclient.InferenceServerClient) -> None:
    assert _self_call(client, "self2", 0) == ""


def test_self_call_without_a_free_instance_times_out(
    client: httpclient.InferenceServerClient,
) -> None:
    # The only instance is busy with the caller: the inner request cannot run before its timeout.
    assert _self_call(client, "self1", 300_000) == "Request timeout expired"
    # No timeout given: bounded by the caller's execute_timeout_seconds (2 s), not a hang.
    message = _self_call(client, "self1", 0)
    assert "gave no answer within 2 s" in message
    assert client.is_model_ready("self1")
    assert _self_call(client, "self2", 0) == ""


def test_exec_outside_execute_is_refused() -> None:
    request = pb_utils.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[]
    )
    with pytest.raises(pb_utils.TritonModelException, match="only supported during the 'execute'"):
        request.exec()


def test_request_arguments_as_triton_checks_them() -> None:
    tensor = pb_utils.Tensor("INPUT0", np.zeros(4, dtype=np.float32))
    request = pb_utils.InferenceRequest(
        model_name=b"add_sub",
        requested_output_names=["OUTPUT0"],
        inputs=[tensor],
        model_version=2,
        timeout=5,
        parameters={"a": 1, "b": "x", "c": True},
    )
    assert request.model_name() == "add_sub"
    assert request.model_version() == 2
    assert request.timeout() == 5
    assert request.parameters() == '{"a": 1, "b": "x", "c": true}'
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str"):
        pb_utils.InferenceRequest(
            model_name="m",
            requested_output_names=[],
            inputs=[],
            parameters={1: "x"},  # type: ignore[dict-item]
        )
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceRequest(
            model_name="m",
            requested_output_names=[],
            inputs=[],
            parameters={"k": 1.5},  # type: ignore[dict-item]
        )
