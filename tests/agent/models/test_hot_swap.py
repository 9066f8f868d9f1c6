"""Hot swap under steady load from a separate client process: no request fails."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from tests.models import write_model
from tests.server import running_agent

CONFIG = """
name: "swap"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific { versions: [ 1 ] } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: {
  data_type: TYPE_FP32 dims: [ 64 ] random_data: true } } } ]
"""


@pytest.fixture(scope="module")
def swap_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("swap") / "models"
    write_model(repo, "swap", mlp_model(seed=1), CONFIG, versions=(1,))
    write_model(repo, "swap", mlp_model(seed=2), None, versions=(2,))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("swap",),
            intra_op_threads=1,
        ),
    )
    with running_agent(config) as agent:
        yield agent


def load(port: int, model: str, config: dict[str, Any] | None = None) -> int:
    body = json.dumps({"parameters": {"config": json.dumps(config)}} if config else {}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/repository/models/{model}/load", data=body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        status: int = resp.status
    return status


def expected_outputs() -> dict[str, str]:
    import onnxruntime as ort

    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(1, 64)
    out = {}
    for version, seed in (("1", 1), ("2", 2)):
        session = ort.InferenceSession(mlp_model(seed=seed).SerializeToString())
        y = session.run(None, {"INPUT0": x})[0].ravel()
        out[version] = ",".join(f"{v:.4f}" for v in y)
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def test_twenty_swaps_under_load_fail_no_request(swap_agent: RunningAgent) -> None:
    port = swap_agent.http_port
    config = swap_agent.dataplane.model_config("swap", None)
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.load_client", f"127.0.0.1:{port}", "swap", "300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    assert client.stdout.readline().strip() == "started"
    swaps: list[tuple[float, float]] = []

    try:
        # Steady state first, then 20 swaps 1 → 2 → 1 ...
        steady_until = time.monotonic() + 1.0
        while time.monotonic() < steady_until:
            time.sleep(0.05)
        for i in range(20):
            config["version_policy"] = {"specific": {"versions": [2 if i % 2 == 0 else 1]}}
            started = time.monotonic()
            assert load(port, "swap", config) == 200
            swaps.append((started, time.monotonic()))
    finally:
        out, _ = client.communicate(timeout=60)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == []
    assert set(report["statuses"]) == {"200"}
    assert set(report["versions"]) == {"1", "2"}
    expected = expected_outputs()
    for version, seen in report["outputs"].items():
        assert seen == [expected[version]], version
    during = [lat for start, lat in report["latencies"] if any(a <= start <= b for a, b in swaps)]
    steady = [lat for start, lat in report["latencies"] if start < swaps[0][0]]
    total = sum(report["statuses"].values())
    print(
        f"\nhot swap: {total} requests, 0 failed; p99 steady {percentile(steady, 99) * 1e3:.1f} ms,"
        f" p99 during swaps {percentile(during, 99) * 1e3:.1f} ms ({len(during)} requests)"
    )
    assert total > 300


def test_failed_new_version_keeps_the_old_one_serving(
    swap_agent: RunningAgent, tmp_path: Path
) -> None:
    port = swap_agent.http_port
    config = swap_agent.dataplane.model_config("swap", None)
    config["version_policy"] = {"specific": {"versions": [7]}}
    with pytest.raises(urllib.error.HTTPError) as err:
        load(port, "swap", config)
    assert err.value.code == 400  # Triton: a load that fails is INVALID_ARG
    message = json.loads(err.value.read())["error"]
    assert message.startswith("load failed for model 'swap': ")
    assert "version 7" in message
    assert "swap/7/model.onnx" in message  # inside the repository, not the device's path
    assert "models/swap/7" not in message
    assert swap_agent.dataplane.model_ready("swap", None)
    rows = swap_agent.dataplane.repository_index()
    assert {"name": "swap", "version": "7", "state": "UNAVAILABLE"}.items() <= next(
        r for r in rows if r.get("version") == "7"
    ).items()
