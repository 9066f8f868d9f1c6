"""The idle workers of one Python model version, and the executions waiting for one.

An execution takes a worker (`take`) and gives it back (`give_back`); the supervisor takes an
idle one for a moment to read its heartbeat (`take_if_idle`) and removes one whose process ended
(`discard`). A worker whose process ended is never handed out again: `discard` marks it, and a
worker marked while an execution held it is not taken back (that execution's caller closes its
pipe). While no worker is idle, `take` waits (every instance busy, or restarting after a
failure), bounded by its timeout; once the version gave up or closed (`fail`), every wait ends
with the reason.

Invariant: each live worker is in exactly one place, the idle queue or one holder's hands.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from agent.backends.python.process import Worker
from agent.errors import ModelNotReadyError

__all__ = ["WorkerPool"]


class WorkerPool:
    """Idle workers, in the order they became idle (thread-safe)."""

    def __init__(self, label: str) -> None:
        self._label = label  # "python model 'm' version 1", for the messages
        self._cond = threading.Condition()
        self._idle: deque[Worker] = deque()
        self._failure = ""
        self._why_none = ""  # what the waiters are told when their wait ends without a worker

    def put(self, worker: Worker) -> None:
        """A worker that just started (or restarted) is idle."""
        with self._cond:
            if self._failure or worker.dead:
                return
            self._idle.append(worker)
            self._cond.notify()

    def give_back(self, worker: Worker) -> bool:
        """An execution is done with `worker`. False (not taken back) when its process ended
        meanwhile or the pool failed: the caller closes its pipe."""
        with self._cond:
            if self._failure or worker.dead:
                return False
            self._idle.append(worker)
            self._cond.notify()
            return True

    def take(self, timeout_s: float) -> Worker:
        """An idle worker, waiting up to `timeout_s` for one.

        Raises:
            ModelNotReadyError: the version gave up or closed (its reason), or no worker was
                idle within `timeout_s` (every instance restarting, or busy).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._idle:
                if self._failure:
                    raise ModelNotReadyError(self._failure)
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f": {self._why_none}" if self._why_none else " (every instance busy)"
                    raise ModelNotReadyError(
                        f"{self._label}: no instance could take the request within "
                        f"{timeout_s:g} s{why}"
                    )
                self._cond.wait(left)
            return self._idle.popleft()

    def take_now(self) -> Worker | None:
        """An idle worker, or None at once when none is (never waits)."""
        with self._cond:
            if self._failure or not self._idle:
                return None
            return self._idle.popleft()

    def take_if_idle(self, worker: Worker) -> bool:
        """Take this worker if it is idle now (the supervisor, to read its heartbeat)."""
        with self._cond:
            if worker not in self._idle:
                return False
            self._idle.remove(worker)
            return True

    def discard(self, worker: Worker) -> bool:
        """The worker's process ended: it is never handed out again. True when it was idle
        (taken out here: the caller closes its pipe); False when an execution holds it (its
        `give_back` then refuses it)."""
        with self._cond:
            worker.dead = True
            if worker in self._idle:
                self._idle.remove(worker)
                return True
            return False

    def waiting_because(self, why: str) -> None:
        """What a wait that ends without a worker says (the instances being restarted)."""
        with self._cond:
            self._why_none = why

    def fail(self, reason: str) -> None:
        """The version gave up or closes: every wait ends with `reason`, and so does every
        later `take`; the idle workers stay where their owner ends them."""
        with self._cond:
            self._failure = reason
            self._idle.clear()
            self._cond.notify_all()
