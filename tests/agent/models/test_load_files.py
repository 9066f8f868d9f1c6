"""Loading a model from files sent with the load request (Triton's `file:<path>` parameters)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc as grpclib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.errors import InvalidInputError
from agent.models.pushed import PushedModels, parse_file_parameters
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from tests.models import M_CONFIG, scale_model, write_model
from tests.server import running_agent

PUSHED_CONFIG = json.dumps(
    {
        "name": "pushed",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1, 4]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1, 4]}],
    }
)


def _scaled(factor: float) -> dict[str, bytes]:
    return {"file:1/model.onnx": scale_model(factor).SerializeToString()}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "m", mlp_model(seed=1), M_CONFIG)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def http(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}", network_timeout=60)
    yield client
    client.close()


@pytest.fixture
def grpc(agent: RunningAgent) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    yield client
    client.close()


def _pushed_root(agent: RunningAgent) -> Path:
    pushed = agent.dataplane.pushed
    assert pushed is not None
    return pushed.root


def _infer_http(client: httpclient.InferenceServerClient) -> np.ndarray:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = httpclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    out = np.asarray(client.infer("pushed", [inp]).as_numpy("Y"))
    assert out is not None
    return out


def test_http_load_from_files_infer_unload(
    agent: RunningAgent, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("pushed", config=PUSHED_CONFIG, files=_scaled(3.0))
    assert http.is_model_ready("pushed")
    np.testing.assert_allclose(_infer_http(http), [[0.0, 3.0, 6.0, 9.0]])
    assert len(list(_pushed_root(agent).iterdir())) == 1
    # A second push replaces the first: its folder goes, the new one serves.
    http.load_model("pushed", config=PUSHED_CONFIG, files=_scaled(5.0))
    np.testing.assert_allclose(_infer_http(http), [[0.0, 5.0, 10.0, 15.0]])
    assert len(list(_pushed_root(agent).iterdir())) == 1
    http.unload_model("pushed")
    assert not http.is_model_ready("pushed")
    assert list(_pushed_root(agent).iterdir()) == []
    assert http.is_model_ready("m")  # the repository's model is untouched


def test_grpc_load_from_files_infer_unload(
    agent: RunningAgent, grpc: grpcclient.InferenceServerClient
) -> None:
    grpc.load_model("pushed", config=PUSHED_CONFIG, files=_scaled(2.0))
    inp = grpcclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    result = grpc.infer("pushed", [inp]).as_numpy("Y")
    np.testing.assert_allclose(result, [[2.0, 2.0, 2.0, 2.0]])
    grpc.unload_model("pushed")
    assert not grpc.is_model_ready("pushed")
    assert list(_pushed_root(agent).iterdir()) == []


@pytest.mark.parametrize("path", ["file:../escape.onnx", "file:/etc/x", "file:1/../../x"])
def test_paths_outside_the_model_folder_are_refused(
    agent: RunningAgent,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
    path: str,
) -> None:
    files = {**_scaled(2.0), path: b"x"}
    with pytest.raises(InferenceServerException, match="must stay within model directory") as err:
        http.load_model("pushed", config=PUSHED_CONFIG, files=files)
    assert err.value.status() == "400"
    with pytest.raises(InferenceServerException, match="must stay within model directory") as err:
        grpc.load_model("pushed", config=PUSHED_CONFIG, files=files)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert list(_pushed_root(agent).iterdir()) == []
    assert not (_pushed_root(agent).parent / "escape.onnx").exists()


def test_files_without_config_are_refused(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    message = "Load parameter 'config' must be specified for model file override"
    with pytest.raises(InferenceServerException, match=message):
        http.load_model("pushed", files=_scaled(2.0))
    with pytest.raises(InferenceServerException, match=message) as err:
        grpc.load_model("pushed", files=_scaled(2.0))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_unrecognized_parameters_and_bad_base64_are_refused(agent: RunningAgent) -> None:
    def post(params: dict[str, object]) -> tuple[int, str]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{agent.http_port}/v2/repository/models/pushed/load",
            data=json.dumps({"parameters": params}).encode(),
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())["error"]

    assert post({"config": PUSHED_CONFIG, "colour": "red"}) == (
        400,
        "unrecognized load parameter 'colour'.",
    )
    status, message = post({"config": PUSHED_CONFIG, "file:1/model.onnx": "not base64!"})
    assert status == 400
    assert "File parameter 'file:1/model.onnx' is not valid base64" in message


def test_a_failing_push_is_refused_and_the_previous_one_keeps_serving(
    agent: RunningAgent, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("pushed", config=PUSHED_CONFIG, files=_scaled(3.0))
    before = set(_pushed_root(agent).iterdir())
    with pytest.raises(InferenceServerException, match="'pushed'") as err:
        http.load_model("pushed", config=PUSHED_CONFIG, files={"file:1/model.onnx": b"no onnx"})
    # Told where the file is in the model, not where the device keeps it.
    assert "pushed/1/model.onnx" in str(err.value)
    assert str(_pushed_root(agent)) not in str(err.value)
    np.testing.assert_allclose(_infer_http(http), [[0.0, 3.0, 6.0, 9.0]])
    assert set(_pushed_root(agent).iterdir()) == before
    http.unload_model("pushed")


def test_file_parameters_are_checked_before_anything_is_written() -> None:
    big = {"file:1/model.onnx": b"x" * 2048}
    with pytest.raises(InvalidInputError, match="over the limit of 1024 bytes"):
        parse_file_parameters(big, has_config=True, max_bytes=1024)
    clash = {"file:1": b"x", "file:1/model.onnx": b"y"}
    with pytest.raises(InvalidInputError, match="directory has been created as a file"):
        parse_file_parameters(clash, has_config=True, max_bytes=1024)
    with pytest.raises(InvalidInputError, match="not a relative file path"):
        parse_file_parameters({"file:": b"x"}, has_config=True, max_bytes=1024)
    ok = parse_file_parameters({"file:./1//model.onnx": b"x"}, has_config=True, max_bytes=9)
    assert ok is not None
    assert dict(ok.files) == {"1/model.onnx": b"x"}
    assert parse_file_parameters({}, has_config=False, max_bytes=9) is None


def test_folders_left_by_a_crash_are_removed_at_start(tmp_path: Path) -> None:
    root = tmp_path / "pushed"
    (root / ".staging-0a1b" / "1").mkdir(parents=True)  # killed half-way through staging
    (root / ".staging-0a1b" / "1" / "model.onnx").write_bytes(b"half")
    (root / "m-2c3d" / "1").mkdir(parents=True)  # a complete push from the previous run
    pushed = PushedModels(root)
    assert list(root.iterdir()) == []
    assert pushed.folder("m") is None


def test_with_a_model_cache_pushed_files_live_in_its_folder_and_are_cleared(
    tmp_path: Path,
) -> None:
    cache_dir = tmp_path / "cache"
    leftover = cache_dir / "pushed" / ".staging-dead" / "1"
    leftover.mkdir(parents=True)  # a push cut short by kill -9
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(intra_op_threads=1, control_mode=ModelControlMode.EXPLICIT),
        cache=CacheConfig(dir=cache_dir),
    )
    with running_agent(config) as running:
        assert list((cache_dir / "pushed").iterdir()) == []
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        try:
            client.load_model("pushed", config=PUSHED_CONFIG, files=_scaled(4.0))
            np.testing.assert_allclose(_infer_http(client), [[0.0, 4.0, 8.0, 12.0]])
            [folder] = (cache_dir / "pushed").iterdir()
            assert (folder / "1" / "model.onnx").is_file()
            assert (folder / "config.pbtxt").is_file()
            # The cache itself holds no version of it: pushes are not signed versions.
            assert running.model_cache is not None
            assert running.model_cache.list_versions("pushed") == []
        finally:
            client.close()
    assert list((cache_dir / "pushed").iterdir()) == []


def test_grpc_parameters_of_the_wrong_type_are_refused(agent: RunningAgent) -> None:
    with grpclib.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        cases = {
            "file:1/model.onnx": "invalid value type for load parameter 'file:1/model.onnx', "
            "expected bytes_param.",
            "colour": "unrecognized load parameter 'colour'.",
        }
        for key, message in cases.items():
            request = pb.RepositoryModelLoadRequest(model_name="pushed")
            request.parameters["config"].string_param = PUSHED_CONFIG
            request.parameters[key].string_param = "x"
            with pytest.raises(grpclib.RpcError) as err:
                stub.RepositoryModelLoad(request, timeout=30)
            assert err.value.code() == grpclib.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == message
        request = pb.RepositoryModelLoadRequest(model_name="pushed")
        request.parameters["config"].bytes_param = b"{}"
        with pytest.raises(grpclib.RpcError) as err:
            stub.RepositoryModelLoad(request, timeout=30)
        assert err.value.details() == (
            "invalid value type for load parameter 'config', expected string_param."
        )
