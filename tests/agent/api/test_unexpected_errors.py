"""An unexpected exception (a bug) is answered in each transport's error form, and counted.

HTTP answers a JSON 500 (never aiohttp's plain-text page), gRPC INTERNAL with the message; the
failed inference is in the statistics and, for a canary's request, in the canary's verdict. A bad
config override in a load request is a JSON 400 with the reason.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc
import pytest

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.daemon import RunningAgent
from tests.models import scale_model, write_versions
from tests.server import running_agent

BOOM = "internal error: RuntimeError: boom"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("unexpected") / "models"
    for name in ("m", "c"):
        write_versions(repo, name, {1: scale_model(1.0), 2: scale_model(2.0)})
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
            intra_op_threads=1,
        ),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def stub(agent: RunningAgent) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def http(agent: RunningAgent, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
    """(status, JSON body, content type)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{agent.http_port}{path}", data=data, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw), err.headers["Content-Type"]


def infer_doc() -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.5] * 4}]}


def grpc_request(model: str, version: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([0.5] * 4)
    return request


def fail_count(agent: RunningAgent, model: str, version: int) -> int:
    status, doc, _ = http(agent, "GET", f"/v2/models/{model}/versions/{version}/stats")
    assert status == 200, doc
    return int(doc["model_stats"][0]["inference_stats"]["fail"]["count"])


def boom(*_args: object, **_kw: object) -> NoReturn:
    raise RuntimeError("boom")


def break_version(agent: RunningAgent, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """Version 2 of `model` raises an exception no code expects for every request."""
    served, _ = agent.registry.resolve(model, "2")
    monkeypatch.setattr(served.versions[2].scheduler, "submit", boom)


def test_unexpected_inference_error_is_json_500_and_internal_and_counted(
    agent: RunningAgent, stub: pb_grpc.GRPCInferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    break_version(agent, monkeypatch, "m")
    before = fail_count(agent, "m", 2)
    status, doc, content_type = http(agent, "POST", "/v2/models/m/versions/2/infer", infer_doc())
    assert (status, doc) == (500, {"error": BOOM})
    assert content_type.startswith("application/json")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(grpc_request("m", "2"))
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert caught.value.details() == BOOM
    [streamed] = list(stub.ModelStreamInfer(iter([grpc_request("m", "2")])))
    assert streamed.error_message == BOOM
    assert fail_count(agent, "m", 2) == before + 3
    # The agent serves on: version 1, and version 2 once it works again.
    assert http(agent, "POST", "/v2/models/m/versions/1/infer", infer_doc())[0] == 200
    monkeypatch.undo()
    assert http(agent, "POST", "/v2/models/m/versions/2/infer", infer_doc())[0] == 200


def test_unexpected_error_outside_inference_is_json_500_and_internal(
    agent: RunningAgent, stub: pb_grpc.GRPCInferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent.dataplane.shared_memory, "status", boom)
    status, doc, content_type = http(agent, "GET", "/v2/systemsharedmemory/status")
    assert (status, doc) == (500, {"error": BOOM})
    assert content_type.startswith("application/json")
    with pytest.raises(grpc.RpcError) as caught:
        stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INTERNAL, BOOM)


def test_unexpected_errors_of_a_canary_count_against_it(
    agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = {"version": 2, "share": 0.5, "window": 5, "promote_after": 5}
    assert http(agent, "POST", "/v2/models/c/canary", policy)[0] == 200
    break_version(agent, monkeypatch, "c")
    answers: list[int] = []
    state = "RUNNING"
    for _ in range(300):  # about 10 expected: 5 candidate requests at share 0.5
        answers.append(http(agent, "POST", "/v2/models/c/infer", infer_doc())[0])
        state = http(agent, "GET", "/v2/models/c/canary")[1]["state"]
        if state != "RUNNING":
            break
    doc = http(agent, "GET", "/v2/models/c/canary")[1]
    assert state == "ROLLED_BACK", doc
    assert (doc["decision"]["requests"], doc["decision"]["errors"]) == (5, 5)
    assert answers.count(500) == 5
    assert set(answers) <= {200, 500}  # the stable version's 200s: none when 5 in a row drew 2
    assert fail_count(agent, "c", 2) == 5
    # Rolled back: the stable version answers every request now.
    after = [http(agent, "POST", "/v2/models/c/infer", infer_doc())[0] for _ in range(3)]
    assert after == [200, 200, 200]


def test_bad_config_override_is_a_json_400_with_the_reason(
    agent: RunningAgent, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    cases = {
        json.dumps({"max_batch_size": -2}): "max_batch_size -2 is not in 0..",
        json.dumps(
            {"input": [{"name": "X", "dims": [1, 0]}]}
        ): "input 'X' dimension must be integer >= 1",
        json.dumps({"instance_group": [{"count": -1}]}): "count -1 is not in 0..",
        json.dumps({"max_batch_size": "many"}): "invalid model config JSON",
    }
    for override, reason in cases.items():
        body = {"parameters": {"config": override}}
        status, doc, content_type = http(agent, "POST", "/v2/repository/models/m/load", body)
        assert status == 400, (override, doc)
        assert reason in doc["error"]
        assert content_type.startswith("application/json")
        with pytest.raises(grpc.RpcError) as caught:
            stub.RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(
                    model_name="m",
                    parameters={"config": pb.ModelRepositoryParameter(string_param=override)},
                )
            )
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (caught.value.details() or "")
    assert http(agent, "POST", "/v2/models/m/infer", infer_doc())[0] == 200
