"""Every error a Triton client can receive, with Triton's status code and wording, HTTP and gRPC.

One table: each row is a situation, what Triton answers (HTTP status, gRPC code, its message),
and the same call made with tritonclient over HTTP and over gRPC. A message is Triton's text,
and where the agent adds its reason, Triton's text comes first (`prefix` rows). No message may
show where the repository lives on the device.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import InferenceServerClient as Grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.http import InferenceServerClient as Http
from tritonclient.utils import InferenceServerException

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from tests.models import M_CONFIG, write_model
from tests.server import running_agent


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton-errors") / "models"
    write_model(repo, "m", mlp_model(), M_CONFIG)
    write_model(repo, "gone", mlp_model(), M_CONFIG.replace('"m"', '"gone"'))
    broken = write_model(repo, "broken", mlp_model(), M_CONFIG.replace('"m"', '"broken"'))
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx model")
    return repo


@pytest.fixture(scope="module")
def agent(repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(name="triton", http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("m", "gone"),
        ),
    )
    with running_agent(config) as running:
        with httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}") as client:
            client.unload_model("gone")  # known, with versions, none READY ("unloaded")
        yield running


@pytest.fixture(scope="module")
def http(agent: RunningAgent) -> Iterator[Http]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(agent: RunningAgent) -> Iterator[Grpc]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    yield client
    client.close()


def _http_infer(client: Http, model: str, version: str = "") -> Any:
    x = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.zeros((1, 64), np.float32))
    return client.infer(model, [x], model_version=version)


def _grpc_infer(client: Grpc, model: str, version: str = "") -> Any:
    x = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.zeros((1, 64), np.float32))
    return client.infer(model, [x], model_version=version)


def _infer_with(
    module: Any, client: Any, name: str, array: np.ndarray, datatype: str, output: str = "OUTPUT0"
) -> Any:
    """Infer on "m" with one input of any name, shape and type, asking for `output`."""
    x = module.InferInput(name, list(array.shape), datatype)
    x.set_data_from_numpy(array)
    return client.infer("m", [x], outputs=[module.InferRequestedOutput(output)])


def _both(
    name: str, array: np.ndarray, datatype: str, output: str = "OUTPUT0"
) -> tuple[Callable[[Http], Any], Callable[[Grpc], Any]]:
    return (
        lambda c: _infer_with(httpclient, c, name, array, datatype, output),
        lambda c: _infer_with(grpcclient, c, name, array, datatype, output),
    )


ZEROS = np.zeros((1, 64), np.float32)
NO_ID = "[request id: <id_unknown>] "


@dataclass(frozen=True)
class Case:
    """A situation, Triton's answer to it, and the call over each transport."""

    http_status: int
    grpc_code: grpc.StatusCode
    message: str
    over_http: Callable[[Http], Any]
    over_grpc: Callable[[Grpc], Any]
    prefix: bool = False  # the agent's reason follows Triton's text


NO_VERSION = "version should be an integral value > 0"
CASES: dict[str, Case] = {
    "infer on an unknown model": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
        lambda c: _http_infer(c, "nope"),
        lambda c: _grpc_infer(c, "nope"),
    ),
    "metadata of an unknown model": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
        lambda c: c.get_model_metadata("nope"),
        lambda c: c.get_model_metadata("nope"),
    ),
    "config of an unknown model": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
        lambda c: c.get_model_config("nope"),
        lambda c: c.get_model_config("nope"),
    ),
    "infer on an unknown version": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'm' version 9 is not found",
        lambda c: _http_infer(c, "m", "9"),
        lambda c: _grpc_infer(c, "m", "9"),
    ),
    "infer on a model with no READY version": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'gone' has no available versions",
        lambda c: _http_infer(c, "gone"),
        lambda c: _grpc_infer(c, "gone"),
        prefix=True,
    ),
    "infer on a version that is not READY": Case(
        503,
        grpc.StatusCode.UNAVAILABLE,
        "Request for unknown model: 'gone' version 1 is not at ready state",
        lambda c: _http_infer(c, "gone", "1"),
        lambda c: _grpc_infer(c, "gone", "1"),
        prefix=True,
    ),
    "statistics of an unknown model": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model 'nope' is not available",
        lambda c: c.get_inference_statistics("nope"),
        lambda c: c.get_inference_statistics("nope"),
    ),
    "statistics of an unknown version": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model version is not available for model 'm'",
        lambda c: c.get_inference_statistics("m", "9"),
        lambda c: c.get_inference_statistics("m", "9"),
    ),
    "load of a model the repository does not hold": Case(
        500,
        grpc.StatusCode.INTERNAL,
        "failed to load 'nope', failed to poll from model repository",
        lambda c: c.load_model("nope"),
        lambda c: c.load_model("nope"),
        prefix=True,
    ),
    "load of a model that fails to load": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        # Triton's account: each version that failed, its state and reason (status code first)
        "load failed for model 'broken': version 1 is at UNAVAILABLE state: Internal: ",
        lambda c: c.load_model("broken"),
        lambda c: c.load_model("broken"),
        prefix=True,
    ),
    "trace settings of an unknown model": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "Request for unknown model : nope",
        lambda c: c.get_trace_settings("nope"),
        lambda c: c.get_trace_settings("nope"),
    ),
    "status of an unknown system shared-memory region": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Unable to find system shared memory region: 'r'",
        lambda c: c.get_system_shared_memory_status("r"),
        lambda c: c.get_system_shared_memory_status("r"),
    ),
    "status of an unknown CUDA shared-memory region": Case(
        404,
        grpc.StatusCode.NOT_FOUND,
        "Unable to find cuda shared memory region: 'r'",
        lambda c: c.get_cuda_shared_memory_status("r"),
        lambda c: c.get_cuda_shared_memory_status("r"),
    ),
    "register of a CUDA shared-memory region": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to register CUDA shared memory region: 'r', GPUs not supported",
        lambda c: c.register_cuda_shared_memory("r", b"\0" * 64, 0, 1024),
        lambda c: c.register_cuda_shared_memory("r", b"\0" * 64, 0, 1024),
    ),
    "an input the model does not have": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected inference input 'BOGUS' for model 'm'",
        *_both("BOGUS", ZEROS, "FP32"),
        prefix=True,
    ),
    "an input of the wrong datatype": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{NO_ID}inference input 'INPUT0' data-type is 'FP64', but model 'm' expects 'FP32'",
        *_both("INPUT0", np.zeros((1, 64), np.float64), "FP64"),
    ),
    "an input of the wrong shape": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{NO_ID}unexpected shape for input 'INPUT0' for model 'm'. Expected [-1,64], got [1,32]",
        *_both("INPUT0", np.zeros((1, 32), np.float32), "FP32"),
        prefix=True,
    ),
    "an output the model does not have": Case(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "unexpected inference output 'BOGUS' for model 'm'",  # Triton names no request id
        *_both("INPUT0", ZEROS, "FP32", "BOGUS"),
    ),
}


def _check(case: Case, raised: InferenceServerException, status: str) -> str:
    message = str(raised.message())
    assert raised.status() == status
    if case.prefix:
        assert message.startswith(case.message), message
    else:
        assert message == case.message
    return message


@pytest.mark.parametrize("situation", list(CASES))
def test_http_answers_as_triton(situation: str, http: Http, repo: Path) -> None:
    case = CASES[situation]
    with pytest.raises(InferenceServerException) as raised:
        case.over_http(http)
    message = _check(case, raised.value, str(case.http_status))
    assert str(repo.parent) not in message


@pytest.mark.parametrize("situation", list(CASES))
def test_grpc_answers_as_triton(situation: str, grpc_client: Grpc, repo: Path) -> None:
    case = CASES[situation]
    with pytest.raises(InferenceServerException) as raised:
        case.over_grpc(grpc_client)
    message = _check(case, raised.value, str(case.grpc_code))
    assert str(repo.parent) not in message


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (
            "abc",
            "failed to get model version from specified version string 'abc' (details: stol), "
            f"{NO_VERSION}",
        ),
        ("-1", f"invalid model version specified '-1' , {NO_VERSION}"),
    ],
)
def test_a_grpc_version_that_is_not_a_number_is_invalid_in_tritons_words(
    version: str, message: str, grpc_client: Grpc
) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: grpc_client.get_model_metadata("m", version),
        lambda: _grpc_infer(grpc_client, "m", version),
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert raised.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
        assert raised.value.message() == message


@pytest.mark.parametrize("version", ["abc", "-1", "1x"])
@pytest.mark.parametrize(
    "route", ["", "/ready", "/config", "/stats", "/infer", "/generate", "/generate_stream"]
)
def test_an_http_version_that_is_not_digits_matches_no_route(
    agent: RunningAgent, route: str, version: str
) -> None:
    """Triton's routes take only digits as a version: anything else is its 404 "Not Found"."""
    method = "POST" if "gen" in route or "infer" in route else "GET"
    request = urllib.request.Request(
        f"http://127.0.0.1:{agent.http_port}/v2/models/m/versions/{version}{route}",
        data=b"{}" if method == "POST" else None,
        method=method,
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request)
    assert raised.value.code == 404
    assert json.loads(raised.value.read()) == {"error": "Not Found"}


def test_contents_with_raw_input_contents_is_refused_in_tritons_words(
    agent: RunningAgent,
) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([0.0] * 64)
    request.raw_input_contents.append(b"\0" * 256)
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'm'"
    )


def test_no_client_facing_text_shows_the_repository_path(
    http: Http, grpc_client: Grpc, repo: Path
) -> None:
    """A load failure names the file onnxruntime refused: inside the repository, not on disk."""
    private = {str(repo), str(repo.resolve())}
    texts: list[str] = []
    for client in (http, grpc_client):
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("broken")
        texts.append(str(raised.value.message()))
    assert "broken/1/model.onnx" in texts[0]
    texts += [json.dumps(row) for row in http.get_model_repository_index()]
    texts += [str(grpc_client.get_model_repository_index(as_json=True))]
    for text in texts:
        assert not any(p in text for p in private), text


def test_cuda_shared_memory_reads_and_clears_succeed_without_a_gpu(
    http: Http, grpc_client: Grpc
) -> None:
    """Triton without GPU support: empty status, unregister succeeds; only register is refused."""
    assert http.get_cuda_shared_memory_status() == []
    http.unregister_cuda_shared_memory()
    http.unregister_cuda_shared_memory("never-registered")
    assert grpc_client.get_cuda_shared_memory_status(as_json=True) == {}
    grpc_client.unregister_cuda_shared_memory()
    grpc_client.unregister_cuda_shared_memory("never-registered")


def test_server_name_is_configurable(http: Http, grpc_client: Grpc) -> None:
    assert http.get_server_metadata()["name"] == "triton"
    assert grpc_client.get_server_metadata().name == "triton"


def _get(agent: RunningAgent, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.http_port}{path}") as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else None


def test_health_answers_carry_the_open_inference_protocol_bodies(
    agent: RunningAgent, http: Http
) -> None:
    assert _get(agent, "/v2/health/live") == (200, {"live": True})
    # Triton's strict readiness: a model whose load failed (as other tests make "broken"'s) is
    # not ready, so neither is the server, until it is unloaded.
    with pytest.raises(InferenceServerException):
        http.load_model("broken")
    # Not ready is Triton's answer: 400, with no body for the server and its text for a model.
    assert _get(agent, "/v2/health/ready") == (400, None)
    assert _get(agent, "/v2/models/broken/ready") == (400, {"error": "Model version not ready"})
    http.unload_model("broken")
    assert _get(agent, "/v2/health/ready") == (200, {"ready": True})
    assert _get(agent, "/v2/models/m/ready") == (200, {"name": "m", "ready": True})
    assert _get(agent, "/v2/models/m/versions/1/ready") == (200, {"name": "m", "ready": True})
    for missing in ("gone", "nope", "m/versions/9", "m/versions/0"):  # unknown: the same 400
        assert _get(agent, f"/v2/models/{missing}/ready") == (
            400,
            {"error": "Model version not ready"},
        )


def test_load_and_unload_outside_explicit_mode_are_unavailable_in_tritons_words(
    repo: Path,
) -> None:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
    )
    text = "explicit model load / unload is not allowed if polling is enabled"
    with running_agent(config) as agent:
        over_http = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        over_grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
        try:
            for client, status in ((over_http, "503"), (over_grpc, "StatusCode.UNAVAILABLE")):
                for call in (client.load_model, client.unload_model):
                    with pytest.raises(InferenceServerException) as raised:
                        call("m")
                    assert raised.value.status() == status
                    assert str(raised.value.message()).startswith(text)
        finally:
            over_http.close()
            over_grpc.close()
