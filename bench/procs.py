"""Child processes of the benchmark: the agent under test, and an RSS sampler for it.

Every child is ended by its own pid (SIGTERM, then SIGKILL after a grace period), never by name,
and always in a `finally`, so an exception or Ctrl-C leaves nothing running.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on http://([^\s:]+):(\d+)")
_GRPC = re.compile(r"gRPC on ([^\s:]+):(\d+)")
_METRICS = re.compile(r"metrics on http://([^\s:]+):(\d+)/metrics")
_PLAN = re.compile(r"^edge_agent_memory_used_bytes ([0-9.e+]+)$", re.MULTILINE)
MB = 1024 * 1024


class BenchError(RuntimeError):
    """A benchmark step failed (the message says which and why)."""


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM the child by pid, wait up to `grace_s`, then SIGKILL it; reaps it in every case."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except BaseException:
        # Interrupted while waiting (a second Ctrl-C): do not leave the child behind.
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        raise


class AgentProcess:
    """`python -m agent serve` on a repository, on a free port; a context manager.

    The port comes from the agent's "listening on http://HOST:PORT" log line. Its stderr is
    drained by a thread for the whole run (so the pipe never fills), keeping the last lines for
    error messages.
    """

    def __init__(
        self,
        repository: Path,
        intra_op_threads: int,
        start_timeout_s: float = 180.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.repository = repository
        self.extra_args = extra_args  # more `serve` flags (`--grpc-engine grpcio`)
        self.intra_op_threads = intra_op_threads
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.grpc_port = 0  # the gRPC line comes before "listening on"
        self.metrics_port = 0  # so does the metrics line
        self._proc: subprocess.Popen[str] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise BenchError("the agent is not running")
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stderr_tail(self) -> str:
        return "\n".join(self._tail)

    def last_error(self) -> str:
        """The agent's last logged line that is not INFO/DEBUG (an error or a traceback's end)."""
        for line in reversed(self._tail):
            if line.strip() and " INFO " not in line and " DEBUG " not in line:
                return line.strip()
        return ""

    def __enter__(self) -> AgentProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "agent",
            "serve",
            "--model-repository",
            str(self.repository),
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--intra-op-threads",
            str(self.intra_op_threads),
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._drain, name="agent-stderr", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._listening.wait(0.1):
            if self._proc.poll() is not None:
                self._reader.join(timeout=2)
                raise BenchError(
                    f"the agent exited with code {self._proc.returncode} before listening:\n"
                    + self.stderr_tail()
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the agent did not listen within {self.start_timeout_s:.0f} s:\n"
                    + self.stderr_tail()
                )

    def _drain(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        for line in proc.stderr:
            self._tail.append(line.rstrip())
            grpc_match = _GRPC.search(line)
            if grpc_match:
                self.grpc_port = int(grpc_match.group(2))
            metrics_match = _METRICS.search(line)
            if metrics_match:
                self.metrics_port = int(metrics_match.group(2))
            if not self._listening.is_set():
                match = _LISTENING.search(line)
                if match:
                    self.port = int(match.group(2))
                    self._listening.set()

    def memory_plan_bytes(self) -> int:
        """What the agent's memory plan reserves for its loaded models
        (`edge_agent_memory_used_bytes`), 0 when it cannot be read."""
        if not self.metrics_port:
            return 0
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode("utf-8", "replace")
        except OSError:
            return 0
        match = _PLAN.search(text)
        return int(float(match.group(1))) if match else 0

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rss_bytes(self) -> int:
        """The agent's resident set size, 0 once it is gone."""
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:
            return 0

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc, grace_s=20)
        if self._reader is not None:
            self._reader.join(timeout=5)


class RssSampler:
    """Polls a process's RSS on a thread while active: the peak (every `interval_s`) and a timed
    series (every `series_every_s`, plus the first and last sample)."""

    def __init__(
        self,
        pid: int,
        interval_s: float = 0.1,
        series_every_s: float = 10.0,
        on_record: Callable[[float, int], None] | None = None,
    ) -> None:
        self._process = psutil.Process(pid)
        self._on_record = on_record
        self.interval_s = interval_s
        self.series_every_s = series_every_s
        self.peak = 0
        self.samples: list[tuple[float, int]] = []  # (seconds since start, rss bytes)
        self._next_record = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> RssSampler:
        self._t0 = time.monotonic()
        self._sample(force=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample(force=True)

    def _sample(self, force: bool = False) -> None:
        try:
            rss = int(self._process.memory_info().rss)
        except psutil.Error:
            return
        self.peak = max(self.peak, rss)
        elapsed = time.monotonic() - self._t0
        if force or elapsed >= self._next_record:
            self.samples.append((elapsed, rss))
            self._next_record = elapsed + self.series_every_s
            if self._on_record is not None:
                self._on_record(elapsed, rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
