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
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import agent
from agent.errors import ModelLoadError

_REAP_S = 5.0  # how long a worker that closed its pipe may take to exit before SIGKILL


@dataclass(slots=True)
class Worker:
    """One worker process and its end of the pipe."""

    index: int
    name: str  # Triton's instance name: GROUP_INDEX
    process: subprocess.Popen[bytes]
    conn: Connection
    ready: bool = False  # initialize succeeded: finalize is due on close


class Launcher:
    """Starts processes from one thread that outlives them (see the module docstring)."""

    def __init__(self, label: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[list[str], int, Future[subprocess.Popen[bytes]]]] = (
            queue.SimpleQueue()
        )
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=f"launch-{label}", daemon=True)
        self._thread.start()

    def start(self, argv: list[str], fd: int) -> subprocess.Popen[bytes]:
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((argv, fd, done))
        return done.result()

    def stop(self) -> None:
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


def kill_worker(worker: Worker) -> None:
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
    """How the worker ended ("exited with code N", "killed by signal N"), once it has."""
    code = reap_worker(worker)
    if code < 0:
        return f"worker (pid {worker.process.pid}) killed by signal {-code}"
    return f"worker (pid {worker.process.pid}) exited with code {code}"
