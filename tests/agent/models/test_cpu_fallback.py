"""No quiet fallback: an ONNX model whose config asks for the TensorRT accelerator, on this
machine (an ONNX Runtime without TensorRT), is refused with what is missing; with
`models.allow_cpu_fallback` it serves on the CPU, and every view says so: the index, the config
response, `/v2/status`, the status page and `edge-agent doctor` (the fleet's status: in
tests/agent/fleet/test_health_status.py).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from agent.cli import doctor
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.models.loader import CPU_FALLBACK_PARAMETER
from agent.runtime.demo import mlp_model
from tests.models import M_CONFIG, write_model
from tests.server import running_agent
from tests.support import http_get, infer_mlp

pytestmark = [
    pytest.mark.e2e,  # agents on threads, and the doctor's probes
    pytest.mark.skipif(
        "TensorrtExecutionProvider" in ort.get_available_providers(),
        reason="this onnxruntime has the TensorRT provider: nothing is missing here",
    ),
]

TENSORRT = (
    "optimization { execution_accelerators { gpu_execution_accelerator : "
    '[ { name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }\n'
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "m", mlp_model(), M_CONFIG + TENSORRT)
    write_model(root, "plain", mlp_model(), M_CONFIG.replace('"m"', '"plain"'))
    return root


def config_for(repo: Path, *, fallback: bool) -> AgentConfig:
    return AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            repository=repo, intra_op_threads=1, exit_on_error=False, allow_cpu_fallback=fallback
        ),
    )


def get_json(port: int, path: str) -> Any:
    code, body = http_get(f"http://127.0.0.1:{port}{path}")
    return code, json.loads(body) if body.startswith((b"{", b"[")) else body.decode()


def doctor_lines(repo: Path, tmp_path: Path, *, fallback: bool) -> dict[str, dict[str, str]]:
    """`edge-agent doctor --json` with a config serving `repo`: its checks by name."""
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'[models]\nrepository = "{repo}"\nexit_on_error = false\n'
        f"allow_cpu_fallback = {str(fallback).lower()}\n"
        '[mqtt]\nhost = ""\n[server]\nhttp_port = 0\ngrpc_port = -1\nmetrics_port = -1\n'
    )
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    out = io.StringIO()
    doctor.run(parser.parse_args(["--config", str(toml), "--json", "--timeout", "0.2"]), out=out)
    return {c["name"]: c for c in json.loads(out.getvalue())["checks"]}


def test_refused_by_default_with_what_is_missing(repo: Path, tmp_path: Path) -> None:
    with running_agent(config_for(repo, fallback=False)) as agent:
        port = agent.http_port
        rows = {r["name"]: r for r in agent.dataplane.repository_index()}
        assert rows["m"]["state"] == "UNAVAILABLE"
        reason = rows["m"]["reason"]
        assert "execution accelerator 'tensorrt' (TensorrtExecutionProvider)" in reason
        assert f"onnxruntime {ort.__version__} does not provide" in reason
        assert "models.allow_cpu_fallback = true" in reason
        assert get_json(port, "/v2/models/m/ready")[0] == 400
        assert infer_mlp(port, "plain")[0] == "1"  # the rest serves on
        assert get_json(port, "/v2/health/ready")[0] == 400  # strict readiness: m failed
        assert agent.dataplane.cpu_fallbacks() == {}
    line = doctor_lines(repo, tmp_path, fallback=False)["model m"]
    assert line["status"] == "WARN"  # refused, and start-up goes on (exit_on_error = false)
    assert "will be refused" in line["detail"]
    assert "tensorrt (TensorrtExecutionProvider)" in line["detail"]
    assert "models.allow_cpu_fallback" in line["fix"]


def test_opted_in_it_serves_on_the_cpu_flagged_everywhere(repo: Path, tmp_path: Path) -> None:
    with running_agent(config_for(repo, fallback=True)) as agent:
        port = agent.http_port
        assert infer_mlp(port, "m")[0] == "1"
        assert get_json(port, "/v2/models/m/ready")[0] == 200
        assert get_json(port, "/v2/health/ready")[0] == 200
        # The index: READY, with the reason saying what it runs without.
        rows = {r["name"]: r for r in agent.dataplane.repository_index()}
        assert rows["m"]["state"] == "READY"
        assert rows["m"]["reason"].startswith("CPU fallback: ")
        assert "TensorrtExecutionProvider" in rows["m"]["reason"]
        assert "running on CPUExecutionProvider" in rows["m"]["reason"]
        assert "reason" not in rows["plain"]  # none: left out, as Triton does
        # The config response carries it as a parameter.
        code, config = get_json(port, "/v2/models/m/config")
        assert code == 200
        note = config["parameters"][CPU_FALLBACK_PARAMETER]["string_value"]
        assert note == rows["m"]["reason"]
        code, plain = get_json(port, "/v2/models/plain/config")
        assert CPU_FALLBACK_PARAMETER not in plain.get("parameters", {})
        # /v2/status flags the row, and the page marks it.
        code, doc = get_json(port, "/v2/status")
        status_rows = {r["name"]: r for r in doc["models"]}
        assert status_rows["m"]["cpu_fallback"] == note
        assert "cpu_fallback" not in status_rows["plain"]
        code, page = get_json(port, "/")
        assert code == 200
        rendered = page.split("<script", 1)[0]  # the page's rows, not its inlined script
        assert rendered.count("CPU fallback</strong>") == 1
        assert agent.dataplane.cpu_fallbacks() == {("m", 1): note}
    line = doctor_lines(repo, tmp_path, fallback=True)["model m"]
    assert line["status"] == "WARN"
    assert line["detail"].startswith("CPU fallback: tensorrt (TensorrtExecutionProvider)")
    assert "plain" not in " ".join(doctor_lines(repo, tmp_path, fallback=True))


def test_an_unknown_accelerator_is_refused_even_with_the_fallback(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    typo = TENSORRT.replace('"tensorrt"', '"tensorrtt"')
    write_model(repo, "m", mlp_model(), M_CONFIG + typo)
    with running_agent(config_for(repo, fallback=True)) as agent:
        (row,) = agent.dataplane.repository_index()
        assert row["state"] == "UNAVAILABLE"
        assert "unknown execution accelerator 'tensorrtt'" in row["reason"]
