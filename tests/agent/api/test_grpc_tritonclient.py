"""KServe v2 gRPC with Triton's own gRPC client: the same calls as the HTTP tests."""

from __future__ import annotations

import queue
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from agent.runtime.daemon import RunningAgent
from tests.models import IDENTITY_TYPES
from tests.support import reference_session, sample


@pytest.fixture
def grpc_url(agent: RunningAgent) -> str:
    assert agent.grpc_port is not None
    return f"127.0.0.1:{agent.grpc_port}"


@pytest.fixture
def client(grpc_url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(grpc_url)


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata().name == "edge-agent"
    assert client.is_model_ready("mlp_classifier", "2")
    assert not client.is_model_ready("mlp_classifier", "9")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata("mlp_classifier", as_json=True)
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "64"]}]


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("mlp_classifier").config
    assert config.max_batch_size == 32
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert client.get_model_config("mixed_add").config.max_batch_size == 4


@pytest.mark.parametrize("version", ["1", "2"])
def test_infer_raw_equals_onnxruntime(
    client: grpcclient.InferenceServerClient, model_repo: Path, version: str
) -> None:
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp_classifier", [inp], model_version=version, request_id="g1")
    expected = reference_session(model_repo / "mlp_classifier" / version / "model.onnx").run(
        None, {"INPUT0": x}
    )[0]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    response = result.get_response()
    assert response.model_version == version
    assert response.id == "g1"


def test_every_datatype_round_trips(client: grpcclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(11)
    inputs, sent = [], {}
    for datatype in IDENTITY_TYPES:
        data = sample(datatype, (2, 3), rng)
        inp = grpcclient.InferInput(f"IN_{datatype}", [2, 3], datatype)
        inp.set_data_from_numpy(data)
        inputs.append(inp)
        sent[datatype] = data
    result = client.infer("identity_all", inputs)
    for datatype, data in sent.items():
        got = result.as_numpy(f"OUT_{datatype}")
        if datatype == "BYTES":
            assert [bytes(v) for v in got.ravel()] == list(data.ravel())
        else:
            np.testing.assert_array_equal(got, data, err_msg=datatype)


def test_typed_contents_and_output_subset(grpc_url: str) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url))
    request = service_pb2.ModelInferRequest(model_name="mixed_add")
    a = request.inputs.add(name="A", datatype="FP32", shape=[1, 4])
    a.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    b = request.inputs.add(name="B", datatype="INT32", shape=[1, 4])
    b.contents.int_contents.extend([1, 1, 1, 1])
    request.outputs.add(name="SUM")
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["SUM"]
    out = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_array_equal(out, [2.0, 3.0, 4.0, 5.0])


def test_errors_map_to_grpc_codes(grpc_url: str, client: grpcclient.InferenceServerClient) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_url))
    bad = service_pb2.ModelInferRequest(model_name="mlp_classifier")
    bad.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 63]).contents.fp32_contents.extend(
        [0.0] * 63
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unexpected shape" in (err.value.details() or "")
    bad.model_name = "nope"
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(bad)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    raw = service_pb2.ModelInferRequest(model_name="mlp_classifier")
    raw.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    raw.raw_input_contents.append(b"\0" * 100)
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(raw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")
    # Still serving.
    inp = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    assert client.infer("mlp_classifier", [inp]).as_numpy("OUTPUT0").shape == (1, 10)


def test_statistics_and_repository_index(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    before = client.get_inference_statistics("mlp_classifier", "1", as_json=True)
    client.infer("mlp_classifier", [inp], model_version="1")
    after = client.get_inference_statistics("mlp_classifier", "1", as_json=True)

    def successes(doc: dict[str, object]) -> int:
        stats = doc["model_stats"][0]["inference_stats"]  # type: ignore[index]
        return int(stats["success"].get("count", 0))

    assert successes(after) == successes(before) + 1
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "mixed_add", "version": "1", "state": "READY"}.items() <= next(
        m for m in index if m["name"] == "mixed_add"
    ).items()


def test_load_needs_explicit_mode(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="explicit"):
        client.load_model("mixed_add")


def test_stream_infer(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        for seed in range(3):
            inp = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
            inp.set_data_from_numpy(np.full((1, 64), seed, np.float32))
            client.async_stream_infer("mlp_classifier", [inp], request_id=str(seed))
        got = [results.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    ids = sorted(r.get_response().id for r in got)  # type: ignore[attr-defined]
    assert ids == ["0", "1", "2"]
