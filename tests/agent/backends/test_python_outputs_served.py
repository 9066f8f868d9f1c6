"""A Python model that leaves outputs out, served over HTTP (JSON and binary) and gRPC: the
answer holds what it returned, in its order, as Triton's does; a request may send no inputs
when they are all optional."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.python_models import write_python_model
from tests.server import running_agent

pytestmark = pytest.mark.e2e

# Answers B before A (the config declares A first), each only when it was sent.
PARTIAL_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in ("B", "A"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUT_" + name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def partial_config(name: str, max_batch_size: int) -> str:
    batching = "dynamic_batching { }\n" if max_batch_size else ""
    dims = "-1" if max_batch_size else "-1, -1"  # the clients send [1, 3]
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
{batching}input [
  {{ name: "A" data_type: TYPE_INT32 dims: [ {dims} ] optional: true }},
  {{ name: "B" data_type: TYPE_FP32 dims: [ {dims} ] optional: true }}
]
output [
  {{ name: "OUT_A" data_type: TYPE_INT32 dims: [ {dims} ] }},
  {{ name: "OUT_B" data_type: TYPE_FP32 dims: [ {dims} ] }}
]
"""


MODELS = ("partial", "partial_batched")
A = np.array([[1, 2, 3]], np.int32)
B = np.array([[0.5, 1.5, 2.5]], np.float32)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("partial") / "models"
    write_python_model(repo, "partial", PARTIAL_MODEL, partial_config("partial", 0))
    write_python_model(repo, "partial_batched", PARTIAL_MODEL, partial_config("partial_batched", 4))
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


def http_inputs(*arrays: tuple[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in arrays:
        tensor = httpclient.InferInput(name, list(array.shape), "INT32" if name == "A" else "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


def grpc_inputs(*arrays: tuple[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays:
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32" if name == "A" else "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_answers_with_the_outputs_the_model_returned(
    agent: RunningAgent, model: str, binary: bool
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    try:
        wanted = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUT_A", "OUT_B")
        ]
        # Only A sent, both outputs asked for: OUT_B is absent, not an error.
        result = client.infer(model, http_inputs(("A", A), binary=binary), outputs=wanted)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["OUT_A"]
        np.testing.assert_array_equal(result.as_numpy("OUT_A"), A)
        assert result.as_numpy("OUT_B") is None
        # Both sent, none named: every output, in the model's order (not the config's).
        result = client.infer(model, http_inputs(("A", A), ("B", B), binary=binary))
        assert [o["name"] for o in result.get_response()["outputs"]] == ["OUT_B", "OUT_A"]
        np.testing.assert_array_equal(result.as_numpy("OUT_B"), B)
        # Named in the config's order: still the model's.
        result = client.infer(model, http_inputs(("A", A), ("B", B), binary=binary), outputs=wanted)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["OUT_B", "OUT_A"]
        np.testing.assert_array_equal(result.as_numpy("OUT_A"), A)
        # Nothing sent (every input is optional): nothing returned.
        assert client.infer(model, []).get_response()["outputs"] == []
    finally:
        client.close()


@pytest.mark.parametrize("model", MODELS)
def test_grpc_answers_with_the_outputs_the_model_returned(agent: RunningAgent, model: str) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        wanted = [grpcclient.InferRequestedOutput(n) for n in ("OUT_A", "OUT_B")]
        result = client.infer(model, grpc_inputs(("B", B)), outputs=wanted)
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUT_B"]
        assert len(response.raw_output_contents) == 1
        np.testing.assert_array_equal(result.as_numpy("OUT_B"), B)
        result = client.infer(model, grpc_inputs(("A", A), ("B", B)))
        assert [o.name for o in result.get_response().outputs] == ["OUT_B", "OUT_A"]
        np.testing.assert_array_equal(result.as_numpy("OUT_A"), A)
        assert list(client.infer(model, []).get_response().outputs) == []
    finally:
        client.close()
