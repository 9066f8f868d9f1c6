"""The fleet link's health: which of its parts fail now, and loops that restart with backoff.

Invariants:
    * A part (the outbox, one of the link's loops, an event sink of the agent) is failing from
      `fault` until `recovered`; the link is `degraded` while any part fails, `online` otherwise.
    * The first failure of a part is logged as an error, its recovery as info; `on_change` runs
      on every change of the set or of a reason (from the thread that made it).
    * `supervise` never lets a loop end silently: an exception restarts it after a backoff that
      doubles from `min_s` to `max_s`, and starts from `min_s` again once the loop has worked.
    * Thread-safe: parts fail and recover from worker threads too (events recorded in a thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping

from agent.errors import AgentError

logger = logging.getLogger(__name__)


class Health:
    """The failing parts of the link (see module docstring)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._lock = threading.Lock()
        self._faults: dict[str, str] = {}

    def fault(self, part: str, reason: str) -> None:
        """`part` fails, for `reason`."""
        with self._lock:
            before = self._faults.get(part)
            self._faults[part] = reason
        if before is None:
            logger.error("fleet link degraded: %s: %s", part, reason)
        if before != reason:
            self._on_change()

    def recovered(self, part: str) -> None:
        """`part` works (again); cheap when it did not fail."""
        if part not in self._faults:  # the common case, without the lock
            return
        with self._lock:
            if self._faults.pop(part, None) is None:
                return
        logger.info("fleet link: %s works again", part)
        self._on_change()

    def replace(self, prefix: str, parts: Mapping[str, str]) -> None:
        """Make `parts` the failing parts whose names start with `prefix` (e.g. event sinks)."""
        with self._lock:
            old = {k: v for k, v in self._faults.items() if k.startswith(prefix)}
            if old == dict(parts):
                return
            for key in old:
                del self._faults[key]
            self._faults.update(parts)
        for part in parts.keys() - old.keys():
            logger.error("fleet link degraded: %s: %s", part, parts[part])
        for part in old.keys() - parts.keys():
            logger.info("fleet link: %s works again", part)
        self._on_change()

    def failing(self, part: str) -> bool:
        return part in self._faults

    def snapshot(self) -> dict[str, str]:
        """What fails now (part: reason); empty when all works."""
        with self._lock:
            return dict(self._faults)


async def supervise(
    part: str,
    body: Callable[[], Awaitable[None]],
    health: Health,
    *,
    min_s: float,
    max_s: float,
) -> None:
    """Run `body` (a loop) until it returns, restarting it with backoff when it raises."""
    delay = min_s
    while True:
        try:
            await body()
            return
        except Exception as exc:
            if not health.failing(part):  # the first failure, or the first since it worked
                delay = min_s
                logger.exception("fleet link %s failed; restarting in %.1f s", part, delay)
            else:
                logger.warning(
                    "fleet link %s failed again: %s; restarting in %.1f s", part, exc, delay
                )
            health.fault(part, why(exc))
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_s)


def why(exc: BaseException) -> str:
    """An exception as a reason: an agent error's message, else its type and message."""
    return exc.message if isinstance(exc, AgentError) else f"{type(exc).__name__}: {exc}"
