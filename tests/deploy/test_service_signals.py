"""SIGTERM under load drains every accepted request; SIGHUP applies config changes live."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.deploy.support import (
    agent_env,
    agent_process,
    http_get,
    notify_socket,
    write_batching,
    write_mlp,
)
from tests.support import wait_until

BURST = 8
PENDING = re.compile(r'nv_inference_pending_request_count\{model="slow",version="1"\} (\S+)')


def pending_requests(metrics_port: int) -> float:
    status, body = http_get(metrics_port, "/metrics")
    assert status == 200
    match = PENDING.search(body.decode())
    return float(match.group(1)) if match else 0.0


def test_sigterm_under_load_answers_every_accepted_request(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    # 'slow' holds requests for 2 s waiting for a batch of 16: they are in flight at SIGTERM.
    write_mlp(repo, "slow", "preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 2000000")
    write_mlp(repo, "fast", "max_queue_delay_microseconds: 100")
    args = ["--model-repository", str(repo), "--http-port", "0", "--metrics-port", "0"]
    with agent_process(args, agent_env()) as agent:
        port, metrics_port = agent.port(), agent.metrics_port()
        host = f"127.0.0.1:{port}"
        steady = subprocess.Popen(
            [sys.executable, "-m", "tests.load_client", host, "fast", "200"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        burst = subprocess.Popen(
            [sys.executable, "-m", "tests.deploy.burst_client", host, "slow", str(BURST)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert steady.stdout is not None
            assert steady.stdout.readline().strip() == "started"
            wait_until(
                lambda: pending_requests(metrics_port) >= BURST,
                f"{BURST} requests queued",
                timeout_s=20,
            )
            started = time.monotonic()
            agent.signal(signal.SIGTERM)
            assert agent.wait(limit_s=40) == 0
            stopped_after = time.monotonic() - started
            burst_out, _ = burst.communicate(timeout=30)
        finally:
            steady_out, _ = steady.communicate("", timeout=30)
            burst.kill()
    result = json.loads(burst_out)
    assert result["statuses"] == [200] * BURST, result
    # The agent waited for the queued batch (up to 2 s), but not for the whole drain bound.
    assert stopped_after < 30, "".join(agent.log.lines[-40:])
    load = json.loads(steady_out.strip().splitlines()[-1])
    assert int(load["statuses"].get("200", 0)) > 0
    # During the drain, new requests are refused (503) or find the port closed (0); none fails.
    assert set(load["statuses"]) <= {"200", "503", "0"}, load


def test_sighup_changes_log_level_and_batching_without_restart(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = write_mlp(repo, "mlp", "max_queue_delay_microseconds: 100")
    config = tmp_path / "agent.toml"
    text = (
        f"[server]\nhttp_port = 0\nmetrics_port = -1\nmax_request_bytes = 1048576\n"
        f'[models]\nrepository = "{repo}"\n[log]\nlevel = "info"\n'
    )
    config.write_text(text)
    with notify_socket(tmp_path) as (sock, address):
        env = agent_env(NOTIFY_SOCKET=address)
        with agent_process(["--config", str(config)], env) as agent:
            port = agent.port()
            sock.wait_for("READY")
            before = json.loads(http_get(port, "/v2/models/mlp/config")[1])
            assert before["dynamic_batching"]["max_queue_delay_microseconds"] in (100, "100")

            write_batching(
                model_dir, "mlp", "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000"
            )
            config.write_text(text.replace('"info"', '"debug"').replace("1048576", "2097152"))
            agent.signal(signal.SIGHUP)
            assert sock.wait_for("RELOADING")["RELOADING"] == "1"
            assert sock.wait_for("READY")["READY"] == "1"
            agent.log.wait_for(re.compile("config reload done: 2 change"))
            agent.log.wait_for(re.compile("log level now debug"))
            agent.log.wait_for(
                re.compile("server.max_request_bytes changed; it takes effect after a restart")
            )

            after = json.loads(http_get(port, "/v2/models/mlp/config")[1])
            batching = after["dynamic_batching"]
            assert batching["max_queue_delay_microseconds"] in (5000, "5000")
            assert [int(s) for s in batching["preferred_batch_size"]] == [4]
            # Same process, still serving: nothing was restarted.
            assert http_get(port, "/v2/models/mlp/ready")[0] == 200
            assert agent.proc.poll() is None
            agent.signal(signal.SIGTERM)
            assert agent.wait() == 0


def test_sighup_with_a_broken_config_keeps_running(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_mlp(repo, "mlp", "max_queue_delay_microseconds: 100")
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[server]\nhttp_port = 0\nmetrics_port = -1\n[models]\nrepository = "{repo}"\n'
    )
    with agent_process(["--config", str(config)], agent_env()) as agent:
        port = agent.port()
        config.write_text("[server]\nhttp_prot = 1\n")
        agent.signal(signal.SIGHUP)
        agent.log.wait_for(re.compile(r"config reload failed.*server\.http_prot"))
        assert http_get(port, "/v2/health/ready")[0] == 200
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
