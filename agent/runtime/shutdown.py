"""One budget for the agent's whole stop, so it always ends before systemd's SIGKILL.

systemd sends SIGKILL `TimeoutStopSec` after SIGTERM (45 s in systemd/edge-agent.service). The
stop gets one budget, `server.stop_timeout_ms` (40 s by default: a 5 s margin under the unit's),
counted from the moment it begins and shared by every part in turn:

* the listeners first (`agent.runtime.listeners.Listeners.stop`): HTTP (the infer lanes and
  aiohttp's handlers), gRPC and metrics stop accepting together and drain together, until the
  drain deadline, `DRAIN_SHARE` of the budget in (30 s of 40); what still runs then is cancelled;
* then the rest of the start-up exit stack, in reverse order, in what is left: the sync cycle in
  progress (waited for until the drain deadline at most: the cache installs atomically), the
  fleet link's `offline` status, the models' unload, the cache;
* a part that still holds the process once the whole budget is spent (a thread that never
  returns, which no `await` can cut short) meets `exit_when_spent`: the agent logs it and ends
  itself with exit status 1, before systemd would kill it without a word.

`StopBudget` is plain arithmetic on an injected clock (`time.monotonic` in the agent).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["DRAIN_SHARE", "EXIT_OVERRUN", "StopBudget", "exit_when_spent"]

logger = logging.getLogger(__name__)

# The listeners drain until this share of the budget has passed; the rest is for what follows
# them (models unload: a Python model's finalize is bounded by its own timeout, 5 s by default).
DRAIN_SHARE = 0.75
EXIT_OVERRUN = 1  # the exit status of a stop that overran its budget


class StopBudget:
    """The time the stop may take, from when it begins (`begin`; the first question begins it).

    Args:
        total_s: the whole stop's budget (`server.stop_timeout_ms` / 1000).
        clock: monotonic seconds.

    Raises:
        ValueError: `total_s` is not positive.
    """

    __slots__ = ("_clock", "_started", "total_s")

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if total_s <= 0:
            raise ValueError(f"a stop budget must be positive, got {total_s}")
        self.total_s = total_s
        self._clock = clock
        self._started: float | None = None

    def begin(self) -> None:
        """The stop begins now (a second call changes nothing)."""
        if self._started is None:
            self._started = self._clock()

    @property
    def drain_s(self) -> float:
        """How long after the beginning the listeners' drain ends."""
        return self.total_s * DRAIN_SHARE

    def elapsed(self) -> float:
        """Seconds since the stop began."""
        self.begin()
        assert self._started is not None
        return self._clock() - self._started

    def left(self) -> float:
        """Seconds left of the whole budget (0: spent)."""
        return max(0.0, self.total_s - self.elapsed())

    def drain_left(self) -> float:
        """Seconds left until the drain deadline (0: past it)."""
        return max(0.0, self.drain_s - self.elapsed())


def exit_when_spent(budget: StopBudget) -> threading.Timer:
    """End the process (`EXIT_OVERRUN`) if it still runs once the whole budget is spent.

    A daemon thread: it never holds the process up, and it still runs while the interpreter
    waits for other threads at exit (a model's executor, a sync download), which is where a
    stuck stop would otherwise wait for systemd's SIGKILL.
    """

    def spent() -> None:
        logger.critical(
            "the stop is still running after its whole budget of %.1f s "
            "(server.stop_timeout_ms): exiting now, before systemd's SIGKILL",
            budget.total_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_OVERRUN)

    timer = threading.Timer(budget.left(), spent)
    timer.name = "stop-budget"
    timer.daemon = True
    timer.start()
    return timer
