"""Triton's trace extension (`/v2[/models/M]/trace/setting`, gRPC TraceSetting) end to end."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, LogConfig, ModelsConfig, ServerConfig
from agent.errors import InvalidInputError
from agent.runtime.daemon import RunningAgent
from agent.tracing.tracer import Trace, Tracer
from tests.server import running_agent

MODEL = "mlp_classifier"
COMPUTE = ["QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def agent(model_repo: Path, trace_dir: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=1 << 20),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
        log=LogConfig(trace_file=trace_dir / "trace.json"),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture(autouse=True)
def reset(agent: RunningAgent, trace_dir: Path) -> Iterator[None]:
    yield
    tracer = agent.dataplane.tracer
    tracer.update(MODEL, {})
    tracer.update(
        None, dict.fromkeys(("trace_level", "trace_rate", "trace_count", "log_frequency"))
    )
    tracer.flush()
    for path in trace_dir.iterdir():
        path.unlink()


@pytest.fixture
def http_client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url)


@pytest.fixture
def grpc_client(agent: RunningAgent) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")


def _http_infer(client: httpclient.InferenceServerClient, request_id: str = "") -> None:
    x = np.zeros((2, 64), np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client.infer(MODEL, [inp], request_id=request_id)


def _grpc_infer(client: grpcclient.InferenceServerClient) -> None:
    x = np.zeros((1, 64), np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client.infer(MODEL, [inp])


def _traces(trace_dir: Path) -> dict[int, dict[str, Any]]:
    """Every trace written so far: id -> {"head": first entry, "stamps": [(name, ns)]}."""
    traces: dict[int, dict[str, Any]] = {}
    for path in sorted(trace_dir.iterdir()):
        for entry in json.loads(path.read_text()):
            trace = traces.setdefault(entry["id"], {"head": None, "stamps": []})
            if "timestamps" in entry:
                trace["stamps"] += [(t["name"], t["ns"]) for t in entry["timestamps"]]
            else:
                trace["head"] = entry
    return traces


def test_defaults_and_extension(
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    trace_dir: Path,
) -> None:
    assert "trace" in http_client.get_server_metadata()["extensions"]
    expected = {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": str(trace_dir / "trace.json"),
        "trace_mode": "triton",
    }
    assert http_client.get_trace_settings() == expected
    assert http_client.get_trace_settings(MODEL) == expected
    doc = grpc_client.get_trace_settings(as_json=True)["settings"]
    assert {k: v["value"] for k, v in doc.items()} == {
        k: v if isinstance(v, list) else [v] for k, v in expected.items()
    }
    _http_infer(http_client)
    assert not list(trace_dir.iterdir())  # tracing is off


def test_http_request_timestamps_in_triton_json(
    http_client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    settings = http_client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
    )
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "1"
    _http_infer(http_client, request_id="req-7")
    assert [p.name for p in trace_dir.iterdir()] == ["trace.json.0"]
    (trace,) = _traces(trace_dir).values()
    assert trace["head"]["model_name"] == MODEL
    assert trace["head"]["model_version"] == 2  # the newest version serves
    assert trace["head"]["request_id"] == "req-7"
    names = [name for name, _ in trace["stamps"]]
    assert names == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "REQUEST_START",
        *COMPUTE,
        "COMPUTE_END",
        "REQUEST_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    stamps = [ns for _, ns in trace["stamps"]]
    assert stamps == sorted(stamps)


def test_grpc_model_settings_and_rate(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    trace_dir: Path,
) -> None:
    doc = grpc_client.update_trace_settings(
        model_name=MODEL,
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "log_frequency": "2"},
        as_json=True,
    )["settings"]
    assert doc["trace_rate"]["value"] == ["2"]
    assert http_client.get_trace_settings()["trace_level"] == ["OFF"]  # global unchanged
    for _ in range(4):
        _grpc_infer(grpc_client)
    traces = _traces(trace_dir)
    assert len(traces) == 2  # one request in two, written once two were taken
    for trace in traces.values():
        names = [name for name, _ in trace["stamps"]]
        assert names[0] == "GRPC_WAITREAD_END"
        assert names[-2:] == ["GRPC_SEND_START", "GRPC_SEND_END"]
        assert "COMPUTE_END" in names


def test_count_stops_tracing(
    http_client: httpclient.InferenceServerClient, agent: RunningAgent, trace_dir: Path
) -> None:
    http_client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"}
    )
    for _ in range(3):
        _http_infer(http_client)
    assert http_client.get_trace_settings()["trace_count"] == "0"
    assert not agent.dataplane.tracer.active  # nothing left to take: one boolean again
    # As Triton: once every trace the count asked for is taken, they go to an indexed file.
    (written,) = trace_dir.iterdir()
    assert re.fullmatch(r"trace\.json\.\d+", written.name)
    assert len(_traces(trace_dir)) == 2


def test_model_settings_fall_back_and_clear(http_client: httpclient.InferenceServerClient) -> None:
    http_client.update_trace_settings(settings={"trace_rate": "5"})
    doc = http_client.update_trace_settings(MODEL, {"trace_level": ["TIMESTAMPS"]})
    assert doc["trace_rate"] == "5"  # from the global settings
    assert doc["trace_level"] == ["TIMESTAMPS"]
    http_client.update_trace_settings(settings={"trace_rate": "7"})
    assert http_client.get_trace_settings(MODEL)["trace_rate"] == "7"
    doc = http_client.update_trace_settings(MODEL, {"trace_level": None})
    assert doc["trace_level"] == ["OFF"]
    http_client.update_trace_settings(MODEL, {"trace_count": "3"})
    doc = http_client.update_trace_settings(MODEL, {})  # no settings: the model's are dropped
    assert doc["trace_count"] == "-1"
    doc = http_client.update_trace_settings(settings={"trace_rate": None})
    assert doc["trace_rate"] == "1000"  # a global key cleared goes back to its start value


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"trace_rate": 1}, "attempt to access JSON non-string as string"),
        ({"trace_rate": "x"}, "Unable to parse 'trace_rate', got: x"),
        ({"trace_rate": "0"}, "Unable to parse 'trace_rate', value is out of range [ 1, "),
        ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        ({"log_frequency": "-1"}, "Unable to parse 'log_frequency', value is out of range"),
        ({"trace_level": "TIMESTAMPS"}, "attempt to access JSON non-array as array"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF'"),
        ({"trace_level": ["TENSORS", "OFF"]}, "Expect only one trace level 'OFF'"),
        ({"trace_level": ["LOUD"]}, "unknown trace level 'LOUD'"),
        ({"trace_file": "/tmp/t.json"}, "trace file location can not be updated through network"),
        ({"trace_mode": "opentelemetry"}, "trace mode can not be updated through network"),
        ({"trace_speed": "1"}, "unknown trace setting 'trace_speed'"),
    ],
)
def test_http_bad_values_are_refused_with_400(
    http_client: httpclient.InferenceServerClient, settings: dict[str, Any], message: str
) -> None:
    before = http_client.get_trace_settings()
    with pytest.raises(InferenceServerException, match=re.escape(message)) as info:
        http_client.update_trace_settings(settings={"trace_rate": "3", **settings})
    assert info.value.status() == "400"
    assert http_client.get_trace_settings() == before


def test_grpc_bad_values_and_unknown_model(
    grpc_client: grpcclient.InferenceServerClient, http_client: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match="Unable to parse 'trace_count'") as info:
        grpc_client.update_trace_settings(settings={"trace_count": "many"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope") as info:
        grpc_client.get_trace_settings(model_name="nope")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope") as info:
        http_client.update_trace_settings("nope", {"trace_rate": "1"})
    assert info.value.status() == "400"


def test_no_trace_file_means_tracing_stays_off() -> None:
    """As Triton: a level that would trace is refused when there is no file to trace to."""
    tracer = Tracer("")
    for model in (None, MODEL):
        with pytest.raises(InvalidInputError, match="trace file name is not given"):
            tracer.update(model, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert tracer.settings()["trace_rate"] == "1000"  # nothing changed
    assert tracer.update(None, {"trace_level": ["OFF"], "trace_rate": "5"})["trace_rate"] == "5"
    assert not tracer.active


def test_trace_entries_are_triton_json() -> None:
    trace = Trace(3, "m", "r1", 1)
    trace.stamp("REQUEST_START", 10)
    trace.executed(20, 5, 1, 2, 3)
    assert trace.entries() == [
        {"id": 3, "model_name": "m", "model_version": 1, "request_id": "r1"},
        {"id": 3, "timestamps": [{"name": "REQUEST_START", "ns": 10}]},
        {"id": 3, "timestamps": [{"name": "QUEUE_START", "ns": 20}]},
        {"id": 3, "timestamps": [{"name": "COMPUTE_START", "ns": 25}]},
        {"id": 3, "timestamps": [{"name": "COMPUTE_INPUT_END", "ns": 26}]},
        {"id": 3, "timestamps": [{"name": "COMPUTE_OUTPUT_START", "ns": 28}]},
        {"id": 3, "timestamps": [{"name": "COMPUTE_END", "ns": 31}]},
    ]
