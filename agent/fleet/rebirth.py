"""Fleet-wide rebirth requests (`PREFIX/_fleet/rebirth`): at most one status a second, and none
lost.

A manager that connects asks every device to publish its status again (a 3.1.1 broker such as
RabbitMQ's sends retained messages only to exact topics, and not across its nodes). Several
managers start together (a rollout, two exporters, an inventory), so a device answers at most
once a second. A request inside that second is not dropped: the manager that sent it may have
subscribed after the last answer went out, and would never see this device. It is answered once,
when the second is over, however many came in it.

Pure: the caller passes the clock and schedules the deferred answer.
"""

from __future__ import annotations

__all__ = ["RebirthPacer"]


class RebirthPacer:
    """When to answer rebirth requests (see the module doc)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._last = float("-inf")  # when the last status went out for a rebirth
        self._due = False  # an answer is scheduled for the end of the interval

    def request(self, now: float) -> float | None:
        """A request arrived at `now`: seconds until its status is due (0.0: publish now, and
        it counts as sent), or None when one is already scheduled and answers it too."""
        if self._due:
            return None
        wait = self._last + self.interval_s - now
        if wait <= 0:
            self._last = now
            return 0.0
        self._due = True
        return wait

    def fired(self, now: float) -> None:
        """The scheduled status went out at `now`."""
        self._due = False
        self._last = now
