"""The `edge-agent serve` command as a process: config file, flags, exit codes, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.models import mlp_model_dir, write_model
from tests.support import wait_listening


def agent_command(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agent",
        "serve",
        "--metrics-port",
        "0",
        "--grpc-port",
        "-1",
        *args,
    ]


@contextmanager
def serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(agent_command(*args), stderr=subprocess.PIPE, text=True)
    try:
        port = wait_listening(proc)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def get(port: int, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=b"{}" if path.endswith("index") else None
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    """One good model, one whose config contradicts its model file."""
    repo = tmp_path / "repo"
    mlp_model_dir(repo, "good")
    write_model(
        repo,
        "bad",
        mlp_model_dir(tmp_path / "scratch", "x").joinpath("1", "model.onnx"),
        'name: "bad"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 64 ] } ]\n',
    )
    return repo


def test_config_file_flags_win_and_sigterm_exits_zero(model_repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[server]\nhttp_port = 0\n[models]\nrepository = "does-not-exist"\n[log]\nlevel = "info"\n'
    )
    with serving("--config", str(config), "--model-repository", str(model_repo)) as (proc, port):
        assert get(port, "/v2/health/ready")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_unknown_config_key_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\nhttp_prot = 8000\n")
    result = subprocess.run(
        agent_command("--config", str(config), "--demo"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "server.http_prot" in result.stderr


def test_wrong_type_in_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[server]\nhttp_port = "eight thousand"\n')
    result = subprocess.run(
        agent_command("--config", str(config), "--demo"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "'server.http_port' must be an integer" in result.stderr


def test_exit_on_error_stops_startup(broken_repo: Path) -> None:
    result = subprocess.run(
        agent_command("--model-repository", str(broken_repo), "--http-port", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "bad" in result.stderr
    assert "configuration expects datatype TYPE_INT32" in result.stderr
    assert "model provides TYPE_FP32" in result.stderr


def test_no_exit_on_error_serves_the_rest(broken_repo: Path) -> None:
    with serving(
        "--model-repository", str(broken_repo), "--http-port", "0", "--no-exit-on-error"
    ) as (proc, port):
        status, raw = get(port, "/v2/repository/index")
        assert status == 200
        rows = {r["name"]: r for r in json.loads(raw)}
        assert rows["good"]["state"] == "READY"
        # A version that failed has its reason in the index; a config that failed has the name
        # alone there (as Triton's) and its reason in the model's metadata error.
        why = rows["bad"].get("reason") or json.loads(get(port, "/v2/models/bad")[1])["error"]
        assert "TYPE_INT32" in why
        assert get(port, "/v2/models/good/ready")[0] == 200
        assert get(port, "/v2/models/bad/ready")[0] == 400
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def test_strict_model_config_refuses_missing_config(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    mlp_model_dir(repo, "noconfig")
    with serving(
        "--model-repository",
        str(repo),
        "--http-port",
        "0",
        "--no-exit-on-error",
        "--strict-model-config=true",
    ) as (_proc, port):
        rows = json.loads(get(port, "/v2/repository/index")[1])
        assert rows == [{"name": "noconfig"}]  # its config failed: the name alone, as Triton's
        status, raw = get(port, "/v2/models/noconfig")
        assert status == 404
        assert "auto-complete is off" in json.loads(raw)["error"]


def test_demo_serves_from_cache_dir(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        agent_command("--demo", "--http-port", "0"), stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        port = wait_listening(proc)
        assert get(port, "/v2/models/mlp_classifier/ready")[0] == 200
        assert (tmp_path / "cache/edge-agent/demo-repository/mlp_classifier/2/model.onnx").is_file()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
