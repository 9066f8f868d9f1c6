"""Helpers for the deployment tests: a notify socket like systemd's, the agent as a process, and
`systemd-analyze verify` against a throw-away root."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.models import mlp_model_dir
from tests.support import LISTENING, METRICS, AgentLog

MLP_CONFIG = """
name: "{name}"
max_batch_size: 16
dynamic_batching {{ {batching} }}
"""


def write_mlp(repo: Path, name: str, batching: str) -> Path:
    """The demo MLP (FP32 [-1, 64] -> [-1, 10]) with a config holding `batching`."""
    model_dir = mlp_model_dir(repo, name)
    write_batching(model_dir, name, batching)
    return model_dir


def write_batching(model_dir: Path, name: str, batching: str) -> None:
    """Rewrite a model's config.pbtxt with a new dynamic_batching block."""
    (model_dir / "config.pbtxt").write_text(MLP_CONFIG.format(name=name, batching=batching))


class NotifySocket:
    """The receiving end of sd_notify: an AF_UNIX datagram socket, bound like systemd's."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.messages: list[dict[str, str]] = []

    def close(self) -> None:
        self.sock.close()

    def receive(self, timeout_s: float) -> dict[str, str] | None:
        """The next message as KEY -> VALUE, or None when none comes within `timeout_s`."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append(fields)
        return fields

    def wait_for(self, key: str, limit_s: float = 60.0) -> dict[str, str]:
        """Read messages until one carries `key` (bounded wait)."""
        deadline = time.monotonic() + limit_s
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None and key in message:
                return message
        raise AssertionError(f"no {key} within {limit_s} s; got {self.messages}")

    def drain(self) -> list[dict[str, str]]:
        """Every message already queued, without waiting."""
        out: list[dict[str, str]] = []
        while (message := self.receive(0.001)) is not None:
            out.append(message)
        return out


@contextmanager
def notify_socket(tmp_path: Path, *, abstract: bool = False) -> Iterator[tuple[NotifySocket, str]]:
    """A bound notify socket and the NOTIFY_SOCKET value that names it."""
    if abstract:
        name = f"edge-agent-test-{os.getpid()}-{time.monotonic_ns()}"
        sock, value = NotifySocket(b"\0" + name.encode()), "@" + name
    else:
        path = tmp_path / "notify.sock"
        sock, value = NotifySocket(str(path)), str(path)
    try:
        yield sock, value
    finally:
        sock.close()


class AgentProcess:
    """`edge-agent serve` as a child process, its stderr collected line by line."""

    def __init__(self, args: list[str], env: Mapping[str, str], *, watchdog_pid: bool) -> None:
        command = [sys.executable, "-m", "agent", "serve", *args]
        if watchdog_pid:
            # systemd sets WATCHDOG_PID to the main pid; `exec` keeps the shell's pid for Python.
            command = ["sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *command]
        self.proc = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env=dict(env), start_new_session=True
        )
        self.log = AgentLog(self.proc)

    def port(self) -> int:
        return int(self.log.wait_for(LISTENING).group(1))

    def metrics_port(self) -> int:
        return int(self.log.wait_for(METRICS).group(1))

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, limit_s: float = 60.0) -> int:
        return self.proc.wait(timeout=limit_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@contextmanager
def agent_process(
    args: list[str], env: Mapping[str, str], *, watchdog_pid: bool = False
) -> Iterator[AgentProcess]:
    """Run the agent; kill it on the way out if the test did not stop it."""
    agent = AgentProcess(args, env, watchdog_pid=watchdog_pid)
    try:
        yield agent
    finally:
        agent.close()


def agent_env(**extra: str) -> dict[str, str]:
    """The test's environment without systemd's variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
        and not k.startswith("EDGE_AGENT_")
    }
    env.update(extra)
    return env


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# --- systemd-analyze verify, offline -------------------------------------------------------------

SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def need(tool: str) -> str:
    """The path of a systemd tool, or skip the test saying how to install it."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found: install Debian's 'systemd' package (make test does)")
    if tool == "systemd-analyze" and not (SYSTEM_UNITS / "sysinit.target").is_file():
        pytest.skip(f"{SYSTEM_UNITS} has no stock units to verify against")
    return path


def prepare_root(root: Path) -> None:
    """Give `root` what verify resolves there: stock units and the commands the unit runs."""
    stock = root / "usr" / "lib" / "systemd" / "system"
    if not stock.exists():
        shutil.copytree(SYSTEM_UNITS, stock, symlinks=True)
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    kill = shutil.which("kill") or "/bin/kill"
    if not (bin_dir / "kill").exists():
        shutil.copy(kill, bin_dir / "kill")
    if not (root / "bin").exists():
        (root / "bin").symlink_to("usr/bin")


def systemd_analyze_verify(root: Path, unit: str) -> None:
    """Verify `unit` (under root/etc/systemd/system) with its drop-ins; any output fails."""
    analyze = need("systemd-analyze")
    prepare_root(root)
    result = subprocess.run(
        [analyze, "--man=no", f"--root={root}", "verify", unit],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify only fails on errors; unknown keys and bad values are warnings on stderr.
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", result.stdout + result.stderr
