"""Pure rules: when a repeating failure is worth telling, so that one failure makes one event.

    notices = Notices(Reminders(first_s=3600))
    for notice in notices.observe(now, {"store": "cannot fetch metadata: ..."}):
        ...   # STARTED once; then nothing (or REMINDER, spaced out); ENDED once when it is gone

A sync loop sees the same failure every cycle (the store is down; a model's pinned version is
not signed). Telling it every cycle turns one bad publish into a flood across a fleet. Here each
failure has a key (what fails) and a reason (how); the caller passes what is failing now, and
gets back what to tell. No I/O and no clock: `now` is an argument (monotonic seconds).

Rules:
    * A key that was not failing: STARTED, with its reason.
    * The same key with another reason: STARTED again (something changed), reminders restart.
    * The same key with the same reason: nothing, or a REMINDER once the reminder is due. The
      first reminder is due `first_s` after the last notice, each next one twice as long after
      the one before, at most `max_s`; `first_s = 0` means never.
    * A key no longer failing: ENDED, with how long it failed and how often it was seen.
    * Keys outside `scope` (when given) are left as they are: a cycle that could not look at
      them says nothing about them.
    * With `announce=False`, STARTED and ENDED are not returned (the failure was told elsewhere,
      e.g. by the swap that failed); only reminders are.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class NoticeKind(enum.Enum):
    """What a notice says."""

    STARTED = "started"
    REMINDER = "reminder"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class Notice:
    """One thing to tell about one failure."""

    kind: NoticeKind
    key: str
    reason: str
    since: float  # when this failure (with this reason) was first seen
    seen: int  # observations of it so far


@dataclass(frozen=True, slots=True)
class Reminders:
    """When to remind of a failure that goes on (`first_s = 0`: never)."""

    first_s: float = 0.0
    max_s: float = 86400.0

    def due_after(self, sent: int) -> float | None:
        """Seconds after the last notice when the next reminder is due.

        Args:
            sent: Reminders already sent for this failure.

        Returns:
            The delay, or None when reminders are off.
        """
        if self.first_s <= 0:
            return None
        return min(self.max_s, self.first_s * float(2 ** min(sent, 32)))


@dataclass(slots=True)
class _Tracked:
    reason: str
    since: float
    last_told: float
    seen: int = 1
    reminders: int = 0


class Notices:
    """Remembers what is failing and decides what to tell (see module docstring).

    Args:
        reminders: The reminder schedule.
    """

    def __init__(self, reminders: Reminders | None = None) -> None:
        self._reminders = reminders or Reminders()
        self._tracked: dict[str, _Tracked] = {}

    def failing(self) -> dict[str, str]:
        """key → reason of what is failing now."""
        return {key: item.reason for key, item in self._tracked.items()}

    def since(self, key: str) -> float | None:
        """When the failure of `key` was first seen, or None when it is not failing."""
        item = self._tracked.get(key)
        return None if item is None else item.since

    def observe(
        self,
        now: float,
        failing: Mapping[str, str],
        *,
        scope: Callable[[str], bool] | None = None,
        announce: bool = True,
    ) -> list[Notice]:
        """Record what is failing now; return what to tell, in key order.

        Args:
            now: Monotonic seconds.
            failing: key → reason of every failure in `scope` seen now.
            scope: Which keys this observation covers (None: all).
            announce: Return STARTED and ENDED notices (False: reminders only).

        Returns:
            The notices.
        """
        told: list[Notice] = []
        for key in sorted(set(failing) | set(self._tracked)):
            if scope is not None and not scope(key):
                continue
            item = self._tracked.get(key)
            reason = failing.get(key)
            if reason is None:
                assert item is not None
                del self._tracked[key]
                told.append(Notice(NoticeKind.ENDED, key, item.reason, item.since, item.seen))
            elif item is None or item.reason != reason:
                item = self._tracked[key] = _Tracked(reason, now, now)
                told.append(Notice(NoticeKind.STARTED, key, reason, now, 1))
            else:
                item.seen += 1
                due = self._reminders.due_after(item.reminders)
                if due is not None and now - item.last_told >= due:
                    item.reminders += 1
                    item.last_told = now
                    told.append(Notice(NoticeKind.REMINDER, key, reason, item.since, item.seen))
        if not announce:
            told = [n for n in told if n.kind is NoticeKind.REMINDER]
        return told
