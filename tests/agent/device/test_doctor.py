"""`edge-agent doctor` run for real on this machine, and the start-up error without ONNX Runtime.

The Jetson release file is simulated (this machine is no Jetson); ONNX Runtime is made
unimportable by an import blocker installed through `sitecustomize`, as on a device where
neither onnxruntime nor onnxruntime-gpu was installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.agent.device.test_tegra import JP62_ORIN_NANO, JP512_XAVIER_NX
from tests.support import free_port, http_get, wait_until

REPO = Path(__file__).resolve().parents[3]

BLOCKER = '''
import sys

class _NoOnnxRuntime:
    """Simulates a device with no ONNX Runtime installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoOnnxRuntime())
'''


def edge_agent(
    *args: str, tmp_path: Path, block_onnxruntime: bool = False
) -> subprocess.CompletedProcess[str]:
    path = [str(REPO)]
    if block_onnxruntime:
        blocker = tmp_path / "blocker"
        blocker.mkdir(exist_ok=True)
        (blocker / "sitecustomize.py").write_text(BLOCKER)
        path.insert(0, str(blocker))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def doctor_json(tmp_path: Path, *args: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    release = tmp_path / "no_release"
    done = edge_agent(
        "doctor", "--json", "--tegra-release", str(release), *args, tmp_path=tmp_path, **kwargs
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def statuses(doc: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in doc["checks"]}


def test_doctor_on_this_machine_reports_every_part(tmp_path: Path) -> None:
    code, doc = doctor_json(tmp_path)
    names = statuses(doc)
    for name in (
        "jetson", "python", "cpu", "memory", "gpu", "cuda", "tensorrt", "onnxruntime", "config",
        "cgroup memory.max", "memory budget", "port http", "port grpc", "port metrics",
        "broker", "store",
    ):  # fmt: skip
        assert name in names, name
    assert names["onnxruntime"] in ("OK", "WARN")
    assert doc["device"]["jetson"] is None
    assert doc["device"]["onnxruntime"]["version"]
    assert doc["agent"]["memory_budget"]["bytes"] > 0
    assert code == (1 if doc["status"] == "FAIL" else 0)


def test_doctor_text_output_has_one_line_per_check_and_a_summary(tmp_path: Path) -> None:
    done = edge_agent("doctor", "--tegra-release", str(tmp_path / "none"), tmp_path=tmp_path)
    lines = done.stdout.splitlines()
    assert any(line.startswith(("OK    onnxruntime", "WARN  onnxruntime")) for line in lines)
    assert lines[-1].split(":")[0] in ("OK", "WARN", "FAIL")


def test_doctor_without_onnxruntime_fails_with_the_fix(tmp_path: Path) -> None:
    code, doc = doctor_json(tmp_path, block_onnxruntime=True)
    assert code == 1
    (ort,) = [c for c in doc["checks"] if c["name"] == "onnxruntime"]
    assert ort["status"] == "FAIL"
    assert "edge-agent[cpu]" in ort["fix"]


def test_serve_without_onnxruntime_stops_at_start_naming_the_fix(tmp_path: Path) -> None:
    done = edge_agent("serve", "--demo", tmp_path=tmp_path, block_onnxruntime=True)
    assert done.returncode == 2
    assert "no ONNX Runtime is importable" in done.stderr
    assert "pip install 'edge-agent[cpu]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_reads_a_simulated_jetpack_6_release_file(tmp_path: Path) -> None:
    release = tmp_path / "nv_tegra_release"
    release.write_text(JP62_ORIN_NANO)
    _, doc = doctor_json(tmp_path, "--tegra-release", str(release))
    assert doc["device"]["jetson"]["l4t"] == "36.4.3"
    (jetson,) = [c for c in doc["checks"] if c["name"] == "jetson"]
    assert jetson["status"] == "OK"
    assert "JetPack 6.2" in jetson["detail"]


def test_doctor_fails_on_a_simulated_jetpack_5_release_file(tmp_path: Path) -> None:
    release = tmp_path / "nv_tegra_release"
    release.write_text(JP512_XAVIER_NX)
    code, doc = doctor_json(tmp_path, "--tegra-release", str(release))
    assert code == 1
    assert statuses(doc)["jetson"] == "FAIL"


def test_doctor_reaches_a_listening_broker_and_warns_on_a_closed_store(tmp_path: Path) -> None:
    closed = free_port()
    with socket.socket() as broker:
        broker.bind(("127.0.0.1", 0))
        broker.listen()
        config = tmp_path / "agent.toml"
        (tmp_path / "root.json").write_text("{}")
        config.write_text(
            f'[mqtt]\nhost = "127.0.0.1"\nport = {broker.getsockname()[1]}\n'
            f'[sync]\nsource = "s3://models/prod"\ns3_endpoint = "http://127.0.0.1:{closed}"\n'
            'trusted_root = "root.json"\n'
            f'[cache]\ndir = "{tmp_path / "cache"}"\n'
        )
        _, doc = doctor_json(tmp_path, "--config", str(config))
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["broker"]["status"] == "OK", checks["broker"]
    assert checks["store"]["status"] == "WARN"
    assert f"127.0.0.1:{closed} not reachable" in checks["store"]["detail"]
    assert checks["path cache.dir"]["status"] == "OK"


def test_doctor_fails_on_a_config_that_does_not_load(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\nno_such_key = 1\n")
    code, doc = doctor_json(tmp_path, "--config", str(config))
    assert code == 1
    assert statuses(doc)["config"] == "FAIL"


def test_doctor_is_listed_in_the_main_help(tmp_path: Path) -> None:
    done = edge_agent("--help", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "doctor" in done.stdout


@pytest.mark.parametrize("port_name", ["http"])
def test_doctor_warns_when_a_port_is_taken(tmp_path: Path, port_name: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = tmp_path / "agent.toml"
        config.write_text(f"[server]\n{port_name}_port = {taken.getsockname()[1]}\n")
        _, doc = doctor_json(tmp_path, "--config", str(config))
    assert statuses(doc)[f"port {port_name}"] == "WARN"


def test_doctor_warns_about_an_api_beyond_loopback_without_protection(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[server]\nhost = "0.0.0.0"\nhttp_port = {free_port()}\ngrpc_port = {free_port()}\n'
        "metrics_port = -1\n"
    )
    _, doc = doctor_json(tmp_path, "--config", str(config))
    (security,) = [c for c in doc["checks"] if c["name"] == "security"]
    assert security["status"] == "WARN", security
    assert "without TLS" in security["detail"]
    assert "server.tls_cert_file" in security["fix"]
    assert "server.http_restricted_api" in security["fix"]


def test_doctor_says_a_loopback_api_is_fine(tmp_path: Path) -> None:
    _, doc = doctor_json(tmp_path)
    (security,) = [c for c in doc["checks"] if c["name"] == "security"]
    assert security["status"] == "OK"
    assert "127.0.0.1" in security["detail"]


def test_doctor_reports_the_agents_own_footprint(tmp_path: Path) -> None:
    _, doc = doctor_json(tmp_path)
    names = statuses(doc)
    assert names["footprint install"] == "OK"
    assert names["footprint imports"] == "OK"
    footprint = doc["footprint"]
    assert set(footprint["extras"]) == {"s3", "otel", "grpcio", "signing", "quantize"}
    imports = footprint["imports"]
    assert {"agent", "aiohttp", "onnxruntime", "numpy"} <= set(imports["packages"])
    # What only some configs use is not imported by `serve` before it reads its config.
    assert not {"grpc", "boto3", "onnx", "cryptography", "paho", "sqlite_utils"} & set(
        imports["packages"]
    )
    assert imports["rss_bytes"] > 0
    assert imports["seconds"] > 0


def test_the_footprint_of_a_running_agent(tmp_path: Path) -> None:
    from agent.device.footprint import running_facts

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "agent", "serve", "--demo", "--http-port", str(port)]
    command += ["--grpc-port", "-1", "--metrics-port", "-1", "--intra-op-threads", "1"]
    agent = subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/v2/health/ready"
        wait_until(lambda: _answers(url), "the agent to be ready", timeout_s=120)
        found = {f["pid"]: f for f in running_facts()}
        assert agent.pid in found, found
        mine = found[agent.pid]
        assert mine["rss_bytes"] > mine["uss_bytes"] > 0
        assert mine["threads"] >= 2
        assert "onnxruntime" in mine["native_packages"]
        assert "grpc" not in mine["native_packages"]
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False
