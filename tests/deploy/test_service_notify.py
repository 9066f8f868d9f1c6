"""The agent under a systemd-like supervisor: READY/STATUS/WATCHDOG/STOPPING over NOTIFY_SOCKET.

Each test binds a real AF_UNIX datagram socket, passes it as NOTIFY_SOCKET (with WATCHDOG_USEC
and WATCHDOG_PID as systemd sets them) and reads what `edge-agent serve` sends.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.deploy.support import agent_env, agent_process, http_get, notify_socket, write_mlp

WATCHDOG_USEC = 200_000  # pings every 0.1 s
STALL_S = 2.5
SERVING = re.compile(r"serving (\d+) model\(s\) on port (\d+)")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("notify") / "models"
    write_mlp(root, "mlp", "max_queue_delay_microseconds: 100")
    return root


def serve_args(repo: Path) -> list[str]:
    return ["--model-repository", str(repo), "--http-port", "0", "--metrics-port", "-1"]


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_after_listening_then_watchdog_then_stopping(
    repo: Path, tmp_path: Path, abstract: bool
) -> None:
    with notify_socket(tmp_path, abstract=abstract) as (sock, address):
        env = agent_env(NOTIFY_SOCKET=address, WATCHDOG_USEC=str(WATCHDOG_USEC))
        with agent_process(serve_args(repo), env, watchdog_pid=True) as agent:
            ready = sock.wait_for("READY")
            match = SERVING.search(ready.get("STATUS", ""))
            assert match, ready
            assert match.group(1) == "1"
            # READY=1 came after the port listened and the models were ready.
            assert http_get(int(match.group(2)), "/v2/health/ready")[0] == 200
            before_ready = sock.messages[: sock.messages.index(ready)]
            assert any("loading" in m.get("STATUS", "") for m in before_ready)
            assert any("model mlp version 1 ready" in m.get("STATUS", "") for m in before_ready)

            pings = 0
            deadline = time.monotonic() + 5.0
            while pings < 5 and time.monotonic() < deadline:
                message = sock.receive(deadline - time.monotonic())
                pings += message is not None and message.get("WATCHDOG") == "1"
            assert pings == 5, sock.messages

            agent.signal(signal.SIGTERM)
            stopping = sock.wait_for("STOPPING")
            assert stopping["STOPPING"] == "1"
            assert agent.wait() == 0


def test_watchdog_pid_of_another_process_means_no_pings(repo: Path, tmp_path: Path) -> None:
    with notify_socket(tmp_path) as (sock, address):
        env = agent_env(NOTIFY_SOCKET=address, WATCHDOG_USEC=str(WATCHDOG_USEC), WATCHDOG_PID="1")
        with agent_process(serve_args(repo), env) as agent:
            sock.wait_for("READY")
            assert sock.receive(0.5) is None  # 5 intervals: a ping would have come
            assert not any("WATCHDOG" in m for m in sock.messages)
            agent.signal(signal.SIGTERM)
            sock.wait_for("STOPPING")
            assert agent.wait() == 0


def test_stalled_event_loop_stops_the_pings(repo: Path, tmp_path: Path) -> None:
    with notify_socket(tmp_path) as (sock, address):
        env = agent_env(
            NOTIFY_SOCKET=address,
            WATCHDOG_USEC=str(WATCHDOG_USEC),
            EDGE_AGENT_STALL_ON_SIGUSR1=str(STALL_S),
        )
        with agent_process(serve_args(repo), env, watchdog_pid=True) as agent:
            sock.wait_for("READY")
            sock.wait_for("WATCHDOG")
            agent.signal(signal.SIGUSR1)
            # The line is logged on the loop right before it blocks: pings sent before it are
            # already queued in our socket, and none can follow until the stall ends.
            agent.log.wait_for(re.compile("stalling the event loop"))
            sock.drain()
            assert sock.receive(1.5) is None  # 15 ping intervals of silence
            agent.log.wait_for(re.compile("event loop stall over"))
            assert sock.wait_for("WATCHDOG", limit_s=2.0)["WATCHDOG"] == "1"  # pings resume
            agent.signal(signal.SIGTERM)
            assert agent.wait() == 0


def test_without_notify_socket_nothing_changes(repo: Path) -> None:
    with agent_process(serve_args(repo), agent_env()) as agent:
        port = agent.port()
        assert http_get(port, "/v2/health/ready")[0] == 200
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
