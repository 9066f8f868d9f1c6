"""The supervisor of one Python model version's workers: it notices a worker's end at once,
finds a worker that hangs, and starts a new one in its place.

One thread per version (`Supervisor.start` once the workers initialized, `stop` before they
are ended) waits on a pidfd per worker (Linux 5.3 and later; elsewhere it polls the processes
every `_POLL_S`), on the pipes of the idle workers it reads a heartbeat from, and on a wake-up
pipe. What it decides is `agent.backends.health.VersionHealth`'s (pure): back-off, the restart
limit, when the version gives up.

* A worker's process ends (it exited, was killed by anyone, the OOM killer included): its
  instance is DOWN at once; the version is not ready when no instance is left UP. Executions
  that were on it fail with the reason (`ModelInstanceFailedError`, the backend raises it);
  requests that wait for a worker wait for another, or for the restart (`WorkerPool.take`,
  bounded by `execute_timeout_seconds`).
* Heartbeat: every `heartbeat_interval_s` each worker gets a PING, answered (PONG) by a thread
  of the worker's own as soon as its pipe reader has it. No PONG within
  `heartbeat_timeout_s` (the model's `heartbeat_timeout_seconds`, else the agent's
  `models.heartbeat_timeout_ms`) is a hang: the worker is killed by PID and handled as above.
  A long `execute` is not a hang: the pipe reader answers while `execute` runs. A process that
  is stopped (SIGSTOP), or whose code holds the GIL for longer than the timeout, is one.
  `execute_timeout_seconds` still bounds each `execute` on its own.
* Restart: after the back-off, on a thread of its own (initialize may take minutes), a new
  worker starts for the instance with the same `initialize` args; once READY it serves.
* Every change goes to the listener (`HealthListener`: the model layer's events and readiness)
  and to the log.

Who reads a worker's pipe, and so its PONGs: the execution that holds it, a decoupled model's
reader thread (always), or this thread while the worker is idle: at the next round it takes the
worker from the pool for as long as it reads what is there (a request never waits on a
heartbeat), and keeps out of the pool one still silent a round after its PING, until it answers
or its timeout kills it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.backends.health import ChangeKind, HealthChange, HealthListener, HealthState
from agent.backends.health import VersionHealth as _VersionHealth
from agent.backends.python import ipc
from agent.backends.python.pool import WorkerPool
from agent.backends.python.process import Worker, exit_reason, kill_worker
from agent.errors import AgentError

__all__ = ["Supervisor", "WorkerHooks"]

# The Python backend's logger: its health lines stay under its name.
logger = logging.getLogger("agent.backends.python.backend")

_POLL_S = 0.25  # without pidfds: how often the processes are polled
_SEND_WAIT_S = 0.05  # a PING waits this long for the pipe, then is tried again next round
_READ_S = 1.0  # bound on reading one message an idle worker sent (it has begun to arrive)


@dataclass(frozen=True, slots=True)
class WorkerHooks:
    """What the supervisor needs of its backend."""

    # Start and initialize a new worker for instance `index` (blocking); raises AgentError.
    restart: Callable[[int], Worker]
    # The worker's process ended: close what it held; `owned`: nobody else holds it now (close
    # its pipe too), else the execution that holds it closes the pipe when it gives it back.
    ended: Callable[[Worker, bool], None]
    # Send a PING; False: the pipe stayed blocked (tried again next round). Raises OSError.
    ping: Callable[[Worker, ipc.Message], bool]
    # Read one message from an idle worker's pipe (side messages handled, PONG included);
    # returns an unexpected message, None otherwise. None: a reader thread of the backend's
    # own reads every pipe (decoupled models).
    read_idle: Callable[[Worker, float], ipc.Message | None] | None


class Supervisor:
    """Watches and restarts the workers of one Python model version (module docstring)."""

    def __init__(
        self,
        label: str,
        workers: list[Worker],
        pool: WorkerPool,
        health: _VersionHealth,
        hooks: WorkerHooks,
        *,
        heartbeat_timeout_s: float,
        listener: HealthListener | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        """`workers`: the current worker of each instance, by index (this keeps it current);
        `label`: "python model 'm' version 1", for the log."""
        self._label = label
        self._workers: list[Worker | None] = list(workers)
        self._pool = pool
        self._health = health
        self._hooks = hooks
        self._interval_s = health.policy.heartbeat_interval_s
        self._timeout_s = heartbeat_timeout_s
        self._listener = listener
        self._extra = extra or {}
        self._lock = threading.Lock()
        self._stopped = False
        self._probing: set[Worker] = set()  # idle workers taken to read their PONG here
        self._unsent: set[Worker] = set()  # their next PING found the pipe blocked
        self._pidfds: dict[Worker, int] = {}
        self._pidfd_ok = sys.platform.startswith("linux")  # os.pidfd_open: Linux 5.3 and later
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name=f"supervise-{label}", daemon=True)

    @property
    def state(self) -> HealthState:
        """The version's health now (one reference: read it once)."""
        return self._health.state

    def workers(self) -> list[Worker]:
        """The current worker of each instance that has one, by index."""
        with self._lock:
            return [w for w in self._workers if w is not None]

    def start(self) -> None:
        with self._lock:
            for worker in self._workers:
                if worker is not None:
                    self._watch(worker)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching (before the backend ends its workers); restarts under way end theirs."""
        with self._lock:
            self._stopped = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():  # stuck reaping a process: leave it what it holds
            logger.warning("%s: the supervisor did not stop within %g s", self._label, timeout_s)
            return
        for worker in list(self._probing):  # taken from the pool to read its PONG
            self._pool.give_back(worker)
        self._probing.clear()
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def hung(self, worker: Worker, verdict: str) -> None:
        """An execution found its worker hung (no answer within execute_timeout_seconds): it is
        killed by PID; its end is handled as any other."""
        kill_worker(worker, verdict)
        self._wake()

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_beat = time.monotonic() + self._interval_s
        while True:
            with self._lock:
                if self._stopped:
                    return
                watched = dict(self._pidfds)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for fd in watched.values():
                poller.register(fd, select.POLLIN)
            probed = {w.conn.fileno(): w for w in self._probing}  # these pipes are ours now
            for fd in probed:
                poller.register(fd, select.POLLIN)
            now = time.monotonic()
            wake_at = min(t for t in (next_beat, self._health_next_due()) if t is not None)
            if not self._pidfd_ok:
                wake_at = min(wake_at, now + _POLL_S)
            events = poller.poll(max(0.0, wake_at - now) * 1000)
            by_fd = {fd: worker for worker, fd in watched.items()}
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif fd in by_fd:
                    self._exited(by_fd[fd])
                elif fd in probed and probed[fd] in self._probing:
                    self._read_probe(probed[fd])
            if not self._pidfd_ok:
                for worker in self.workers():
                    if worker.process.poll() is not None:
                        self._exited(worker)
            now = time.monotonic()
            self._start_due(now)
            if now >= next_beat:
                self._beat(now)
                next_beat = now + self._interval_s

    def _health_next_due(self) -> float | None:
        with self._lock:
            return self._health.next_due()

    def _watch(self, worker: Worker) -> None:
        """Open the worker's pidfd (under the lock)."""
        if not self._pidfd_ok:
            return
        try:
            self._pidfds[worker] = os.pidfd_open(worker.process.pid)
        except (OSError, AttributeError):  # an old kernel, seccomp: poll the processes instead
            self._pidfd_ok = False

    def _exited(self, worker: Worker) -> None:
        """The worker's process ended: its instance is DOWN; the back-off starts."""
        with self._lock:
            if self._workers[worker.index] is not worker:
                return
            self._workers[worker.index] = None
            fd = self._pidfds.pop(worker, None)
        if fd is not None:
            os.close(fd)
        self._unsent.discard(worker)
        probed = worker in self._probing
        self._probing.discard(worker)
        owned = self._pool.discard(worker) or probed
        reason = exit_reason(worker)
        self._hooks.ended(worker, owned)
        with self._lock:
            change = self._health.failed(worker.index, reason, time.monotonic())
        self._tell(change)

    def _start_due(self, now: float) -> None:
        with self._lock:
            due = [] if self._stopped else self._health.due(now)
        for index in due:  # initialize may take minutes: each restart on a thread of its own
            threading.Thread(
                target=self._restart, args=(index,), name=f"restart-{self._label}", daemon=True
            ).start()
        if due:
            self._pool.waiting_because(self.state.reason)

    def _restart(self, index: int) -> None:
        try:
            worker = self._hooks.restart(index)
        except AgentError as exc:
            with self._lock:
                stopped = self._stopped
                change = (
                    None
                    if stopped
                    else self._health.restart_failed(index, exc.message, time.monotonic())
                )
            self._tell(change)
            self._wake()
            return
        with self._lock:
            change = None
            if not self._stopped:
                change = self._health.restarted(index, time.monotonic())
            if change is not None:
                self._workers[index] = worker
                self._watch(worker)
        if change is None:  # stopped or given up meanwhile: this worker is not wanted
            kill_worker(worker)
            self._hooks.ended(worker, True)
            return
        self._pool.put(worker)
        self._tell(change)
        self._wake()

    def _beat(self, now: float) -> None:
        """Judge each worker's last PING and send the next one.

        A PING goes out without taking the worker from the pool: its PONG is read by the next
        execution on it, or here at the next round, when the worker is idle and the PONG is
        already in its pipe (so requests never wait on a heartbeat). A worker still silent one
        round after its PING is held out of the pool until it answers, or is killed at its
        timeout.
        """
        for worker in self.workers():
            answered = worker.pongs >= worker.pings and worker not in self._unsent
            if not answered:
                if now - worker.pinged_at >= self._timeout_s:
                    kill_worker(worker, f"hung: no heartbeat answer within {self._timeout_s:g} s")
                    continue  # its pidfd says it ended: handled then
                if worker in self._unsent:
                    self._send_ping(worker)  # its pipe was blocked: try again
                    continue
                if not self._read_if_idle(worker):
                    continue  # still silent (held, if idle), or busy: its execution reads it
            worker.pinged_at = now
            self._unsent.add(worker)
            self._send_ping(worker)

    def _send_ping(self, worker: Worker) -> None:
        """Send the worker's next PING; one whose pipe stayed blocked is tried again next
        round (its clock runs from the first try)."""
        number = worker.pings + 1
        try:
            sent = self._hooks.ping(worker, ipc.Message(ipc.PING, {"n": number}))
        except OSError:
            return  # it is gone: its pidfd says so
        if sent:
            worker.pings = number
            self._unsent.discard(worker)

    def _read_if_idle(self, worker: Worker) -> bool:
        """Whether the worker's last PING is answered now: an idle worker (not a decoupled
        one: its reader thread reads everything) is taken from the pool, and what its pipe
        holds is read at once; one still silent stays taken, its pipe watched, until its PONG
        comes or its timeout."""
        if self._hooks.read_idle is None or worker in self._probing:
            return worker.pongs >= worker.pings
        if not self._pool.take_if_idle(worker):
            return worker.pongs >= worker.pings  # busy: its execution reads the PONG
        try:
            while worker.pongs < worker.pings and worker.conn.poll(0):
                self._read(worker)
        except OSError:
            pass  # its pipe is gone: its pidfd says so
        if worker.pongs >= worker.pings:
            self._pool.give_back(worker)
            return True
        self._probing.add(worker)
        return False

    def _read(self, worker: Worker) -> None:
        read = self._hooks.read_idle
        assert read is not None
        try:
            stray = read(worker, time.monotonic() + _READ_S)
        except (TimeoutError, EOFError, OSError, ipc.WireError):
            stray = None  # it is ending: its pidfd says so (or its heartbeat's timeout)
        if stray is not None:
            logger.warning(
                "%s instance %s sent %r while idle; ignored", self._label, worker.name, stray.kind
            )

    def _read_probe(self, worker: Worker) -> None:
        """A held (silent) worker's pipe is readable: read; give it back once it answered."""
        self._read(worker)
        if worker.pongs >= worker.pings:
            self._probing.discard(worker)
            self._pool.give_back(worker)

    # --- reporting ----------------------------------------------------------------------------

    def _tell(self, change: HealthChange | None) -> None:
        if change is None:
            return
        if change.kind is ChangeKind.FAILED:
            logger.error(
                "%s instance %s failed: %s; %d of %d instance(s) serving; restart in %.1f s",
                self._label,
                change.instance,
                change.reason,
                change.live,
                change.instances,
                change.restart_in_s or 0.0,
                extra=self._extra,
            )
            if change.live == 0:
                self._pool.waiting_because(self.state.reason)
        elif change.kind is ChangeKind.RESTARTED:
            logger.info(
                "%s instance %s serving again (%d of %d instance(s) serving)",
                self._label,
                change.instance,
                change.live,
                change.instances,
                extra=self._extra,
            )
        else:
            logger.error("%s: %s", self._label, change.reason, extra=self._extra)
            self._pool.fail(f"{self._label} is unavailable: {change.reason}")
        if self._listener is not None:
            try:
                self._listener(change)
            except Exception:  # a listener's bug must not stop the supervision
                logger.exception("%s: health listener failed", self._label)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            os.write(self._wake_w, b"\0")
