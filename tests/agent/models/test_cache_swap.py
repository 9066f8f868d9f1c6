"""Serving from the model cache: activate and roll back, and SIGKILL at every step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.faults import ENV
from agent.runtime.demo import mlp_model
from model_cache import ACTIVATE_STEPS, INSTALL_STEPS
from tests.models import M_CONFIG, write_model
from tests.support import MLP_X, infer_mlp, wait_listening

SWAP_STEPS = ("swap-built", *ACTIVATE_STEPS, "swap-switched", "swap-old-released")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def expected(seed: int) -> np.ndarray:
    session = ort.InferenceSession(mlp_model(seed=seed).SerializeToString())
    out: np.ndarray = session.run(None, {"INPUT0": MLP_X})[0]
    return out


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A cache holding version 1 (active) and version 2 (ready) of model m."""
    for version in (1, 2):
        write_model(tmp_path / f"src{version}", "m", mlp_model(seed=version), M_CONFIG, (version,))
    cache = tmp_path / "cache"
    assert (
        cli(
            "cache",
            "install",
            "m",
            "1",
            str(tmp_path / "src1/m"),
            "--cache-dir",
            str(cache),
            "--activate",
        ).returncode
        == 0
    )
    result = cli("cache", "install", "m", "2", str(tmp_path / "src2/m"), "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    return cache


def start_agent(
    cache: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "serve",
            "--cache-dir",
            str(cache),
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--metrics-port",
            "-1",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, wait_listening(proc)


def stop_agent(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.stderr is not None
    proc.stderr.close()


def post(port: int, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body or {}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc: dict[str, object] = json.loads(resp.read())
    return doc


def test_activate_and_rollback_over_http_and_cli(cache_dir: Path) -> None:
    proc, port = start_agent(cache_dir)
    try:
        version, out = infer_mlp(port)
        assert version == "1"
        np.testing.assert_allclose(out, expected(1).ravel(), rtol=1e-5)
        url = f"http://127.0.0.1:{port}"
        result = cli("activate", "m", "2", "--url", url)
        assert result.returncode == 0, result.stderr
        assert "now serves version 2" in result.stdout
        version, out = infer_mlp(port)
        assert version == "2"
        np.testing.assert_allclose(out, expected(2).ravel(), rtol=1e-5)
        assert cli("rollback", "m", "--url", url).returncode == 0
        assert infer_mlp(port)[0] == "1"
        assert post(port, "/v2/repository/models/m/rollback", {"version": 2})["version"] == 2
        assert infer_mlp(port)[0] == "2"
        with urllib.request.urlopen(f"{url}/v2/repository/models/m/versions") as resp:
            states = {v["version"]: v["state"] for v in json.loads(resp.read())}
        assert states == {1: "retired", 2: "active"}
        lifted = cli("clear-rejected", "m", "--url", url)  # version 1 was rolled back from
        assert (lifted.returncode, lifted.stdout) == (0, "m: version(s) 1 no longer rejected\n")
        assert cli("clear-rejected", "m", "--url", url).stdout == "m: no rejected version\n"
        missing = cli("activate", "m", "9", "--url", url)
        assert missing.returncode == 1
        assert "no version 9" in missing.stderr
    finally:
        stop_agent(proc)
    # The cache remembers what was active across a restart.
    proc, port = start_agent(cache_dir)
    try:
        assert infer_mlp(port)[0] == "2"
    finally:
        stop_agent(proc)


def test_cache_cli_refuses_while_the_agent_holds_the_cache(cache_dir: Path) -> None:
    proc, _ = start_agent(cache_dir)
    try:
        result = cli("cache", "list", "--cache-dir", str(cache_dir))
        assert result.returncode == 1
        assert "in use by another process" in result.stderr
    finally:
        stop_agent(proc)


@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_sigkill_during_cache_install_serves_a_complete_version(tmp_path: Path, step: str) -> None:
    write_model(tmp_path / "src1", "m", mlp_model(seed=1), M_CONFIG, (1,))
    write_model(tmp_path / "src2", "m", mlp_model(seed=2), M_CONFIG, (2,))
    cache = tmp_path / "cache"
    assert (
        cli(
            "cache",
            "install",
            "m",
            "1",
            str(tmp_path / "src1/m"),
            "--cache-dir",
            str(cache),
            "--activate",
        ).returncode
        == 0
    )
    env = dict(os.environ, **{ENV: step})
    died = cli(
        "cache",
        "install",
        "m",
        "2",
        str(tmp_path / "src2/m"),
        "--cache-dir",
        str(cache),
        "--activate",
        env=env,
    )
    assert died.returncode == -signal.SIGKILL
    proc, port = start_agent(cache)
    try:
        version, out = infer_mlp(port)
        assert version == "1"
        np.testing.assert_allclose(out, expected(1).ravel(), rtol=1e-5)
    finally:
        stop_agent(proc)
    assert list((cache / "staging").iterdir()) == []
    listing = cli("cache", "list", "--cache-dir", str(cache)).stdout
    assert "m\t1\tactive" in listing
    # Version 2 is either complete and ready, or gone: never half-written.
    assert "m\t2\tstaged" not in listing


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_sigkill_at_each_swap_step_restarts_on_a_complete_version(
    cache_dir: Path, step: str
) -> None:
    proc, port = start_agent(cache_dir, dict(os.environ, **{ENV: step}))
    try:
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            post(port, "/v2/repository/models/m/versions/2/activate")
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        stop_agent(proc)
    proc, port = start_agent(cache_dir)
    try:
        version, out = infer_mlp(port)
        np.testing.assert_allclose(out, expected(int(version)).ravel(), rtol=1e-5)
        # What is served is what the cache says is active.
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/v2/repository/models/m/versions"
        ) as r:
            active = [v["version"] for v in json.loads(r.read()) if v["state"] == "active"]
        assert active == [int(version)]
        # Crashing before the cache committed keeps version 1; after, version 2.
        committed = step in ("swap-switched", "swap-old-released", "db-active")
        assert version == ("2" if committed else "1")
    finally:
        stop_agent(proc)
