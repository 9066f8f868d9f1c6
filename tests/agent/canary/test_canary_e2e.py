"""Canary rollouts end to end: a real agent, Triton's HTTP client, per-version statistics."""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from agent.config.loader import load_config
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import save_ready, scale_model, write_versions
from tests.server import running_agent


def failing_model() -> onnx.ModelProto:
    """Y = table[floor(2 X)] with a one-entry table: fine for X < 0.5, an ONNX Runtime error (index
    out of range) for X >= 0.5. Zeros (memory measurement) run fine; there is no warm-up."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [1], [7.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["X", "two"], ["X2"]),
            helper.make_node("Floor", ["X2"], ["F"]),
            helper.make_node("Cast", ["F"], ["I"], to=TensorProto.INT64),
            helper.make_node("Gather", ["table", "I"], ["Y"], axis=0),
        ],
        "fails_above_half",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])],
        [table, two],
    )
    return save_ready(graph)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("canary") / "models"
    for name in ("share", "promo", "codes", "conf"):
        write_versions(root, name, {1: scale_model(1.0), 2: scale_model(2.0)})
    write_versions(root, "fail", {1: scale_model(1.0), 2: failing_model()})
    write_versions(root, "single", {1: scale_model(1.0)})
    return root


@pytest.fixture(scope="module")
def agent(repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=0),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    yield triton
    triton.close()


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def infer(
    client: httpclient.InferenceServerClient, model: str, x: float, version: str = ""
) -> tuple[str, float]:
    """One request with X filled with `x`; returns (served version, Y[0, 0])."""
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), x, dtype=np.float32))
    result = client.infer(model, [tensor], model_version=version)
    out = result.as_numpy("Y")
    assert out is not None
    return str(result.get_response()["model_version"]), float(out[0, 0])


def success_counts(port: int, model: str) -> dict[str, int]:
    status, doc = call(port, "GET", f"/v2/models/{model}/stats")
    assert status == 200
    return {s["version"]: s["inference_stats"]["success"]["count"] for s in doc["model_stats"]}


def events(caplog: pytest.LogCaptureFixture, kind: str, model: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"event {kind} model={model} ")
    ]


def test_share_of_unversioned_traffic_within_binomial_bound(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    port = agent.http_port
    status, doc = call(
        port,
        "POST",
        "/v2/models/share/canary",
        {"version": 2, "share": 0.1, "promote_after": 100_000},
    )
    assert status == 200, doc
    assert (doc["state"], doc["candidate"], doc["baseline"], doc["share"]) == ("RUNNING", 2, 1, 0.1)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=30)
    text = metrics.read().decode()
    assert 'edge_agent_canary_share{model="share",version="2"} 0.1' in text
    assert 'edge_agent_canary_share{model="share",version="1"} 0.9' in text
    n = 2000
    served = [infer(client, "share", 0.25) for _ in range(n)]
    # Each unversioned request goes to version 2 with probability 0.1, independently (seeded
    # only by the agent's own RNG): the count is binomial(2000, 0.1), mean 200, sigma 13.4.
    # Five sigma either side (133..267) fails a correct router about once in 1.7 million runs,
    # and catches a share off by 4 points (mean 120 or 280) every time.
    counts = success_counts(port, "share")
    sigma = math.sqrt(n * 0.1 * 0.9)
    assert abs(counts["2"] - n * 0.1) <= 5 * sigma, counts
    assert counts["1"] + counts["2"] == n
    assert sum(v == "2" for v, _ in served) == counts["2"]
    assert all(y == (0.5 if v == "2" else 0.25) for v, y in served)  # each version's own output
    # An explicit version is never rerouted.
    assert {infer(client, "share", 0.25, "1")[0] for _ in range(50)} == {"1"}
    _, doc = call(port, "GET", "/v2/models/share/canary")
    candidate, baseline = doc["window"]
    assert (candidate["version"], candidate["requests"]) == (2, min(100, counts["2"]))
    assert (baseline["version"], baseline["errors"]) == (1, 0)
    status, doc = call(port, "DELETE", "/v2/models/share/canary")
    assert status == 200
    assert (doc["state"], doc["pinned_version"]) == ("STOPPED", 1)
    assert {infer(client, "share", 0.25)[0] for _ in range(30)} == {"1"}


def test_failing_candidate_rolled_back_automatically(
    agent: RunningAgent, client: httpclient.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = agent.http_port
    policy = {"version": 2, "share": 0.5, "window": 20, "promote_after": 1000}
    status, doc = call(port, "POST", "/v2/models/fail/canary", policy)
    assert status == 200, doc
    errors: list[str] = []
    for _ in range(400):  # ~40 expected: 20 failed candidate requests at share 0.5
        try:
            version, y = infer(client, "fail", 0.9)
            assert (version, round(y, 5)) == ("1", 0.9)
        except InferenceServerException as exc:
            errors.append(str(exc))
        _, doc = call(port, "GET", "/v2/models/fail/canary")
        if doc["state"] != "RUNNING":
            break
    assert doc["state"] == "ROLLED_BACK"
    assert len(errors) == 20
    assert all("onnxruntime failed" in e for e in errors)
    decision = doc["decision"]
    assert decision["action"] == "ROLLBACK"
    assert (decision["requests"], decision["errors"], decision["error_rate"]) == (20, 20, 1.0)
    assert decision["reason"] == "error rate 1.00 over the last 20 requests > 0.05"
    assert doc["pinned_version"] == 1
    [event] = events(caplog, "canary_rolled_back", "fail")
    assert "'reason': 'error rate 1.00 over the last 20 requests > 0.05'" in event
    assert "'errors': 20" in event
    # All unversioned traffic now goes to version 1 and succeeds.
    assert {infer(client, "fail", 0.9)[0] for _ in range(50)} == {"1"}
    # The candidate still answers when asked by name (it is loaded, only not routed to).
    assert infer(client, "fail", 0.1, "2") == ("2", 7.0)


def test_healthy_candidate_promoted(
    agent: RunningAgent, client: httpclient.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = agent.http_port
    policy = {"version": 2, "share": 0.5, "window": 10, "promote_after": 30, "max_p95_ms": 5000}
    status, _ = call(port, "POST", "/v2/models/promo/canary", policy)
    assert status == 200
    for _ in range(500):  # ~60 expected
        infer(client, "promo", 1.0)
        _, doc = call(port, "GET", "/v2/models/promo/canary")
        if doc["state"] != "RUNNING":
            break
    assert doc["state"] == "PROMOTED"
    assert doc["decision"]["good_requests"] == 30
    assert doc["decision"]["errors"] == 0
    assert doc["pinned_version"] == 2
    [event] = events(caplog, "canary_promoted", "promo")
    assert "'good_requests': 30" in event
    assert {infer(client, "promo", 1.0) for _ in range(30)} == {("2", 2.0)}
    assert infer(client, "promo", 1.0, "1") == ("1", 1.0)
    # Unversioned traffic is pinned to 2 now: a canary on it again has no baseline.
    status, doc = call(port, "POST", "/v2/models/promo/canary", {"version": 2, "share": 0.5})
    assert status == 400
    assert "baseline" in doc["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/v2/models/codes/canary", {"version": 2, "share": 0}, 400, "share"),
        ("/v2/models/codes/canary", {"version": 2, "share": 1.5}, 400, "share"),
        ("/v2/models/codes/canary", {"version": "2", "share": 0.1}, 400, "must be an integer"),
        ("/v2/models/codes/canary", {"version": 2.5, "share": 0.1}, 400, "must be an integer"),
        ("/v2/models/codes/canary", {"version": 2, "share": 0.1, "x": 1}, 400, "unknown canary"),
        ("/v2/models/codes/canary", b"{oops", 400, "malformed JSON"),
        ("/v2/models/single/canary", {"version": 1, "share": 0.1}, 400, "is the baseline"),
        ("/v2/models/nosuch/canary", {"version": 2, "share": 0.1}, 404, "unknown model"),
        ("/v2/models/codes/canary", {"version": 9, "share": 0.1}, 404, "not READY"),
    ],
)  # fmt: skip
def test_bad_canary_requests(
    agent: RunningAgent, path: str, body: Any, status: int, text: str
) -> None:
    got, doc = call(agent.http_port, "POST", path, body)
    assert got == status, doc
    assert text in doc["error"]


def test_conflict_stop_and_status_codes(agent: RunningAgent) -> None:
    port = agent.http_port
    assert call(port, "GET", "/v2/models/codes/canary") == (
        200, {"model": "codes", "state": "NONE", "pinned_version": None, "persistent": False}
    )  # fmt: skip
    assert call(port, "DELETE", "/v2/models/codes/canary")[0] == 404
    assert call(port, "GET", "/v2/models/nosuch/canary")[0] == 404
    assert call(port, "POST", "/v2/models/codes/canary", {"version": 2, "share": 0.2})[0] == 200
    status, doc = call(port, "POST", "/v2/models/codes/canary", {"version": 1, "share": 0.2})
    assert status == 409
    assert "already runs" in doc["error"]
    status, doc = call(port, "DELETE", "/v2/models/codes/canary")
    assert (status, doc["state"], doc["pinned_version"]) == (200, "STOPPED", 1)
    # A second DELETE drops the pin: unversioned requests go to the latest version again.
    status, doc = call(port, "DELETE", "/v2/models/codes/canary")
    assert (status, doc["pinned_version"]) == (200, None)


def test_canary_started_from_the_config_file(
    repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f"""
[server]
http_port = 0
grpc_port = -1
metrics_port = -1

[models]
repository = "{repo}"
intra_op_threads = 1

[canary.conf]
version = 2
share = 0.25
window = 10
promote_after = 500
max_p95_ms = 250

[canary.single]
version = 3
share = 0.1
"""
    )
    config = load_config(toml, {})
    with running_agent(config) as running:
        status, doc = call(running.http_port, "GET", "/v2/models/conf/canary")
        assert status == 200
        assert (doc["state"], doc["candidate"], doc["baseline"], doc["share"]) == (
            "RUNNING", 2, 1, 0.25
        )  # fmt: skip
        assert doc["policy"]["max_p95_ms"] == 250
        _, single = call(running.http_port, "GET", "/v2/models/single/canary")
        assert single["state"] == "NONE"
    [refused] = events(caplog, "canary_refused", "single")
    assert "version 3 of model 'single' is not READY" in refused
    assert events(caplog, "canary_started", "conf")
