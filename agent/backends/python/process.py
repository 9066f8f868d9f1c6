"""Worker processes of the Python backend: started from one thread, ended by PID.

Workers exit when their pipe closes, and (Linux) are SIGKILLed by the kernel when the thread that
started them ends (PR_SET_PDEATHSIG). That signal follows the *thread*, so each backend starts its
workers from its own `Launcher` thread, which lives until the backend closes. Each worker is a
fresh interpreter (`python -m agent.backends.python.worker.main`), never a fork of the
threaded agent.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import agent
from agent.backends.python import ipc
from agent.backends.python.wakeup import Wakeup
from agent.errors import ModelLoadError

_REAP_S = 5.0  # how long a worker that closed its pipe may take to exit before SIGKILL


@dataclass(slots=True, eq=False)  # compared and hashed by identity: a restart makes a new one
class Worker:
    """One worker process, its end of the pipe, and what its heartbeat says.

    Sends go through `send` (one lock): the executor thread sends EXECUTE and BLS results, the
    supervisor its PINGs. `pings` is the number of the last PING sent, `pongs` of the last PONG
    read (by whoever reads the pipe then: the executor, a decoupled model's reader thread, or
    the supervisor while the worker is idle). The agent's end of the pipe is non-blocking
    (`ipc` waits itself); `wakeup` is what an `execute` waits on
    (`agent.backends.python.wakeup`).
    """

    index: int
    name: str  # Triton's instance name: GROUP_INDEX
    process: subprocess.Popen[bytes]
    conn: Connection
    wakeup: Wakeup = field(init=False, repr=False)
    ready: bool = False  # initialize succeeded: finalize is due on close
    pings: int = 0
    pongs: int = 0
    pinged_at: float = 0.0  # `time.monotonic()` when PING number `pings` went out
    verdict: str = ""  # why the agent killed it ("hung: ..."), said instead of its signal
    dead: bool = False  # its process ended: never handed out again
    _send_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        os.set_blocking(self.conn.fileno(), False)  # a read that finds data needs no poll first
        self.wakeup = Wakeup(self.conn.fileno())

    def close(self) -> None:
        """Close the agent's end of the pipe and the wake-up pipe (idempotent)."""
        self.wakeup.close()
        self.conn.close()

    def send(self, message: ipc.Message) -> None:
        """Send to the worker (blocking). Raises OSError when it is gone."""
        with self._send_lock:
            ipc.send(self.conn, message)

    def send_frame(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Send an encoded message (`ipc.encode`), as `send`."""
        with self._send_lock:
            ipc.send_frame(self.conn, buffers)

    def try_send(self, message: ipc.Message, timeout_s: float) -> bool:
        """Send a small message unless the pipe stays blocked for `timeout_s` (another send
        holds it, or the worker has stopped reading). Raises OSError when it is gone."""
        if not self._send_lock.acquire(timeout=timeout_s):
            return False
        try:
            poller = select.poll()  # not select(): a busy agent's descriptors pass 1024
            poller.register(self.conn.fileno(), select.POLLOUT)
            if not poller.poll(timeout_s * 1000):
                return False
            ipc.send(self.conn, message)
            return True
        finally:
            self._send_lock.release()


class Launcher:
    """Starts processes from one thread that outlives them (see the module docstring)."""

    def __init__(self, label: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[list[str], int, Future[subprocess.Popen[bytes]]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=f"launch-{label}", daemon=True)
        self._thread.start()

    def start(self, argv: list[str], fd: int) -> subprocess.Popen[bytes]:
        """Start a process (from the launcher's thread).

        Raises:
            OSError: it could not be started, or the launcher has stopped (its backend closes).
        """
        done: Future[subprocess.Popen[bytes]] = Future()
        with self._lock:
            if self._stopped:
                raise OSError("the model is closing: no new worker is started")
            self._jobs.put((argv, fd, done))
        return done.result()

    def stop(self) -> None:
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._jobs.put(([], -1, Future()))

    def _serve(self) -> None:
        env = dict(os.environ)
        # The worker imports `agent` from where this agent runs, installed or not.
        root = str(Path(agent.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        while True:
            argv, fd, done = self._jobs.get()
            if not argv:
                return
            try:
                done.set_result(
                    subprocess.Popen(argv, pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL)
                )
            except OSError as exc:
                done.set_exception(exc)


def kill_worker(worker: Worker, verdict: str = "") -> None:
    """SIGKILL the worker by PID and reap it; `verdict` (e.g. "hung: ...") says why, in place
    of "killed by signal 9", wherever its end is reported."""
    if verdict and not worker.verdict and worker.process.poll() is None:
        worker.verdict = f"{verdict}; worker (pid {worker.process.pid}) killed"
    if worker.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait()


def reap_worker(worker: Worker) -> int:
    """Wait for a worker to end (SIGKILL by PID after a grace period); its exit status."""
    try:
        return worker.process.wait(timeout=_REAP_S)
    except subprocess.TimeoutExpired:
        kill_worker(worker)
        return worker.process.wait()


def spawn_worker(launcher: Launcher, index: int, instance_name: str, model_name: str) -> Worker:
    """Start a worker interpreter (`python -m agent.backends.python.worker.main`) on a new pipe.

    Raises:
        ModelLoadError: the process could not be started.
    """
    ours, theirs = multiprocessing.Pipe(duplex=True)
    argv = [
        sys.executable,
        "-m",
        "agent.backends.python.worker.main",
        str(theirs.fileno()),
        str(os.getpid()),
    ]
    try:
        process = launcher.start(argv, theirs.fileno())
    except OSError as exc:
        ours.close()
        raise ModelLoadError(f"python model '{model_name}': cannot start a worker: {exc}") from None
    finally:
        theirs.close()  # the worker holds its own copy; EOF then means the worker is gone
    return Worker(index, instance_name, process, ours)


def exit_reason(worker: Worker) -> str:
    """How the worker ended ("exited with code N", "killed by signal N", or why the agent
    killed it), once it has."""
    code = reap_worker(worker)
    if worker.verdict:
        return worker.verdict
    if code < 0:
        return f"worker (pid {worker.process.pid}) killed by signal {-code}"
    return f"worker (pid {worker.process.pid}) exited with code {code}"
