"""What a gRPC connection may hold for a peer that does not take it: a pure budget and a clock.

Both engines bound one connection's answers that wait for its peer (in the transport's write
buffer, behind the peer's flow-control windows, or in grpc core) by `UNSENT_CAP`: windows the
peer grants are not a licence to buffer. Memory is allocated when a call runs (the model's
output, then its serialized answer), so the budget decides which received calls may run:

    admit  when  unsent + (running + 1) * estimate <= cap
           or    nothing runs and unsent < cap      (an answer over the cap still goes out)

`estimate` is the connection's recent largest answer: the size of a larger one at once, halfway
back toward a smaller one, and `cap // 4` before the first answer (a connection runs at most 4
calls before it has shown how large its answers are). A call not admitted waits, received but
not run, until the engine asks again (an answer sent, a call ended, the peer took bytes).

`StallClock` says when a backed-up connection has made no progress (no byte taken by its peer)
for the send timeout: the engine then closes it. Nothing here reads a clock or a socket: time
and byte counts are arguments.
"""

from __future__ import annotations

__all__ = ["UNSENT_CAP", "SendBudget", "StallClock"]

UNSENT_CAP = 8 * 1024 * 1024  # bytes of answers one connection may hold for its peer
_FIRST_GUESS_SHARE = 4  # calls run before the first answer: cap // estimate


class SendBudget:
    """One connection's admission of calls (see the module doc)."""

    __slots__ = ("cap", "estimate", "running")

    def __init__(self, cap: int = UNSENT_CAP) -> None:
        self.cap = cap
        self.running = 0  # admitted calls whose answer is not yet in `unsent`
        self.estimate = max(1, cap // _FIRST_GUESS_SHARE)

    def admit(self, unsent: int) -> bool:
        """Whether one more call may run now, given the bytes the connection holds unsent."""
        if self.running == 0:
            return unsent < self.cap
        return unsent + (self.running + 1) * self.estimate <= self.cap

    def started(self) -> None:
        """An admitted call runs."""
        self.running += 1

    def answered(self, size: int) -> None:
        """A call produced an answer of `size` bytes (it tells the next ones' size)."""
        estimate = self.estimate
        self.estimate = size if size >= estimate else max(1, (estimate + size) // 2)

    def ended(self) -> None:
        """An admitted call ended (its answer is now unsent bytes, or it has none)."""
        self.running -= 1


class StallClock:
    """Whether a connection has been backed up with no byte taken for `timeout_s`."""

    __slots__ = ("_sent", "_since", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sent = -1
        self._since = 0.0

    def stalled(self, now: float, sent: int, backed_up: bool) -> bool:
        """One look: `sent` counts every byte the peer took so far (any monotonic count).

        Returns:
            True once the connection was backed up at every look for `timeout_s` while `sent`
            did not move; a look not backed up, or one where `sent` moved, starts over.
        """
        if not backed_up or sent != self._sent:
            self._sent = sent if backed_up else -1
            self._since = now
            return False
        return now - self._since >= self.timeout_s
