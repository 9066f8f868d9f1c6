"""End to end with Triton's own HTTP client against a running agent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import IDENTITY_TYPES
from tests.support import reference_session, sample


@pytest.fixture
def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url)


def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "edge-agent"
    assert "binary_tensor_data" in meta["extensions"]
    assert "classification" in meta["extensions"]


def test_model_ready_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("mlp_classifier")
    assert client.is_model_ready("mlp_classifier", "1")
    assert not client.is_model_ready("mlp_classifier", "7")
    meta = client.get_model_metadata("mlp_classifier")
    assert meta["versions"] == ["1", "2"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 10]}]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("no_such_model")


def test_model_config_is_triton_json(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("mlp_classifier")
    assert config["name"] == "mlp_classifier"
    assert config["max_batch_size"] == 32
    assert config["input"][0]["dims"] == [64]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 16]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 200
    # mixed_add has no config.pbtxt: auto-complete filled it from the model.
    mixed = client.get_model_config("mixed_add")
    assert mixed["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in mixed["input"]] == [
        ("A", "TYPE_FP32", [4]),
        ("B", "TYPE_INT32", [4]),
    ]
    assert mixed["version_policy"] == {"latest": {"num_versions": 1}}


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("version", ["1", "2"])
def test_mlp_outputs_equal_onnxruntime(
    client: httpclient.InferenceServerClient, model_repo: Path, binary: bool, version: str
) -> None:
    rng = np.random.default_rng(int(version))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(
        "mlp_classifier", [inp], model_version=version, outputs=[out], request_id=f"req-{version}"
    )
    expected = reference_session(model_repo / "mlp_classifier" / version / "model.onnx").run(
        None, {"INPUT0": x}
    )[0]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    response = result.get_response()
    assert response["model_version"] == version
    assert response["id"] == f"req-{version}"


def test_versions_differ_and_default_is_latest(client: httpclient.InferenceServerClient) -> None:
    x = np.ones((1, 64), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    v1 = client.infer("mlp_classifier", [inp], model_version="1").as_numpy("OUTPUT0")
    latest = client.infer("mlp_classifier", [inp])
    assert latest.get_response()["model_version"] == "2"
    assert not np.array_equal(v1, latest.as_numpy("OUTPUT0"))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_round_trips(client: httpclient.InferenceServerClient, binary: bool) -> None:
    rng = np.random.default_rng(7)
    inputs, sent = [], {}
    for datatype in IDENTITY_TYPES:
        data = sample(datatype, (2, 3), rng)
        inp = httpclient.InferInput(f"IN_{datatype}", [2, 3], datatype)
        inp.set_data_from_numpy(data, binary_data=binary)
        inputs.append(inp)
        sent[datatype] = data
    outputs = [
        httpclient.InferRequestedOutput(f"OUT_{d}", binary_data=binary) for d in IDENTITY_TYPES
    ]
    result = client.infer("identity_all", inputs, outputs=outputs)
    for datatype, data in sent.items():
        got = result.as_numpy(f"OUT_{datatype}")
        assert got.shape == data.shape, datatype
        if datatype == "BYTES":
            # JSON carries BYTES as text, which tritonclient hands back as str.
            got_bytes = [v if isinstance(v, bytes) else v.encode() for v in got.ravel()]
            assert got_bytes == list(data.ravel())
        else:
            np.testing.assert_array_equal(got, data, err_msg=datatype)


def test_two_inputs_of_different_types_and_output_subset(
    client: httpclient.InferenceServerClient,
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.int32)
    ia = httpclient.InferInput("A", [2, 4], "FP32")
    ia.set_data_from_numpy(a)
    ib = httpclient.InferInput("B", [2, 4], "INT32")
    ib.set_data_from_numpy(b, binary_data=False)
    result = client.infer("mixed_add", [ia, ib], outputs=[httpclient.InferRequestedOutput("DIFF")])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - 3)
    assert result.as_numpy("SUM") is None


def test_reshape_in_and_out(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput("X", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("flat", [inp])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)


def test_repository_index(client: httpclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    rows = {(r["name"], r.get("version")): r["state"] for r in index}
    assert rows[("mlp_classifier", "1")] == "READY"
    assert rows[("mlp_classifier", "2")] == "READY"
    assert rows[("mixed_add", "1")] == "READY"
