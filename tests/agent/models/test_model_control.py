"""Model control modes (poll, explicit) and the memory-aware swap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.demo import mlp_model
from tests.models import M_CONFIG, save_ready, write_model
from tests.server import running_agent
from tests.support import LOGS, METRICS, wait_listening, wait_until


def infer(port: int, model: str = "m") -> tuple[int, dict[str, Any]]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{model}/infer",
        data=json.dumps(doc).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def post(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body or {}).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_poll_mode_serves_a_slowly_copied_version_only_once_complete(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "m", mlp_model(seed=1), M_CONFIG, (1,))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, control_mode=ModelControlMode.POLL, poll_quiet_ms=150),
    )
    payload = mlp_model(seed=2).SerializeToString()
    with running_agent(config) as agent:
        port = agent.http_port
        assert infer(port)[1]["model_version"] == "1"
        (repo / "m" / "2").mkdir()
        target = repo / "m" / "2" / "model.onnx"
        third = len(payload) // 3
        with target.open("wb") as f:
            for start in (0, third, 2 * third):
                f.write(payload[start : start + third] if start < 2 * third else payload[start:])
                f.flush()
                os.fsync(f.fileno())
                # Deliberately longer than the quiet period (150 ms) between chunks: a watcher
                # that loaded on a pause would serve the partial version 2 by the check below.
                time.sleep(0.4)
                status, doc = infer(port)
                assert status == 200
                if start < 2 * third:
                    assert doc["model_version"] == "1"
        wait_until(lambda: infer(port)[1]["model_version"] == "2", "version 2 served")
        rows = agent.dataplane.repository_index()
        assert [r["version"] for r in rows if r.get("state") == "READY"] == ["2"]


def test_load_and_unload_need_explicit_mode(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "m", mlp_model(), M_CONFIG)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo),
    )
    with running_agent(config) as agent:
        status, raw = post(agent.http_port, "/v2/repository/models/m/unload")
        assert status == 503  # Triton: UNAVAILABLE, in its words
        message = json.loads(raw)["error"]
        assert message.startswith("explicit model load / unload is not allowed if polling")
        assert "--model-control-mode explicit" in message
        assert infer(agent.http_port)[0] == 200


def test_explicit_mode_loads_only_what_it_is_told(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "m", mlp_model(), M_CONFIG)
    write_model(repo, "other", mlp_model(), M_CONFIG.replace('"m"', '"other"'))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            repository=repo, control_mode=ModelControlMode.EXPLICIT, load_models=("m",)
        ),
    )
    with running_agent(config) as agent:
        port = agent.http_port
        assert infer(port)[0] == 200
        assert infer(port, "other")[0] == 404
        assert post(port, "/v2/repository/models/other/load")[0] == 200
        assert infer(port, "other")[0] == 200
        assert post(port, "/v2/repository/models/other/unload")[0] == 200
        status, doc = infer(port, "other")
        assert status == 404  # Triton: NOT_FOUND, no version to serve; the reason follows
        assert doc["error"] == (
            "Request for unknown model: 'other' has no available versions: unloaded"
        )
        bad = {"parameters": {"config": "{not json"}}
        status, raw = post(port, "/v2/repository/models/m/load", bad)
        assert status == 500  # Triton fails the poll: INTERNAL, as the model-control examples read
        assert json.loads(raw)["error"].startswith(
            "failed to load 'm', failed to poll from model repository: Invalid config override: "
        )
        override = {"parameters": {"config": json.dumps({"name": "m", "max_batch_size": 2})}}
        assert post(port, "/v2/repository/models/m/load", override)[0] == 200
        assert agent.dataplane.model_config("m", None)["max_batch_size"] == 2
        status, raw = post(port, "/v2/repository/models/nope/load")
        assert status == 500  # Triton: INTERNAL, in its words; no path of the device
        message = json.loads(raw)["error"]
        assert message.startswith("failed to load 'nope', failed to poll from model repository")
        assert str(repo) not in message


def big_mlp(seed: int) -> onnx.ModelProto:
    """About 64 MiB of weights, so its footprint stands out of the process's noise."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, 4096)) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((4096, 4096)) * 0.01).astype(np.float32)
    w3 = (rng.standard_normal((4096, 10)) * 0.01).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["INPUT0", "W1"], ["H1"]),
        helper.make_node("Relu", ["H1"], ["R1"]),
        helper.make_node("MatMul", ["R1", "W2"], ["H2"]),
        helper.make_node("MatMul", ["H2", "W3"], ["OUTPUT0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "W1"), (w2, "W2"), (w3, "W3"))],
    )
    return save_ready(graph)


def run_agent_process(repo: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--metrics-port",
            "0",
            "--model-control-mode",
            "explicit",
            "--load-model",
            "m",
            "--log-level",
            "info",
            *extra,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, wait_listening(proc)


def used_bytes(port_line: str) -> float:
    for line in port_line.splitlines():
        if line.startswith("edge_agent_memory_used_bytes"):
            return float(line.split()[-1])
    raise AssertionError("no edge_agent_memory_used_bytes in /metrics")


def test_memory_aware_swap_drains_first_when_both_do_not_fit(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(
        repo,
        "m",
        big_mlp(1),
        M_CONFIG.replace("max_batch_size: 4", "max_batch_size: 1")
        + "version_policy: { specific { versions: [ 1 ] } }\n",
        (1,),
    )
    write_model(repo, "m", big_mlp(2), None, (2,))
    # First run: how much the agent plus one version holds in the budget.
    # The pool for requests in flight fixed: by default it follows the budget, which changes.
    inflight = ("--inflight-memory-bytes", str(64 << 20))
    proc, port = run_agent_process(repo, *inflight)
    first_pid = proc.pid
    try:
        metrics_port = _metrics_port(proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            one_version = used_bytes(resp.read().decode())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # Second run: the same start-up plus room for one version and a half, not two.
    model_mib = int(LOGS[first_pid].wait_for(MODEL_MIB).group(1))
    budget = int(one_version + model_mib * (1 << 20) // 2)
    proc, port = run_agent_process(repo, "--memory-budget-bytes", str(budget), *inflight)
    try:
        client = subprocess.Popen(
            [sys.executable, "-m", "tests.load_client", f"127.0.0.1:{port}", "m", "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "started"
        override = {"name": "m", "version_policy": {"specific": {"versions": [2]}}}
        try:
            status, raw = post(
                port,
                "/v2/repository/models/m/load",
                {"parameters": {"config": json.dumps(override)}},
            )
        finally:
            out, _ = client.communicate(timeout=60)
        assert status == 200, raw
        report = json.loads(out.strip().splitlines()[-1])
        assert report["errors"] == []
        assert set(report["statuses"]) == {"200"}
        assert infer(port)[1]["model_version"] == "2"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log = LOGS[proc.pid].lines
    assert any("swap strategy drain-first" in line for line in log), "".join(log[-20:])


MODEL_MIB = re.compile(r"model m version 1 ready .*, (\d+) MiB\)")


def _metrics_port(proc: subprocess.Popen[str]) -> int:
    return int(LOGS[proc.pid].wait_for(METRICS).group(1))
