"""When a scheduler should run its batches on the event loop instead of the executor.

The hand-off to an executor thread costs tens of microseconds; for a model that computes
faster than that, running on the loop is cheaper. Both schedulers (`agent.scheduling.scheduler`
and `agent.scheduling.sequence_scheduler`) measure their executions and switch once the
averages are low enough. Pure: the callers pass the times they measured.
"""

from __future__ import annotations

PROBE_RUNS = 4  # executions measured on the executor before inline is considered
WALL_FACTOR = 10  # wall-time limit for inline, as a multiple of the CPU-time limit


class InlineGauge:
    """Moving averages of one execution's CPU and wall time, and the verdict on them."""

    def __init__(self, inline_below_ns: int) -> None:
        self.inline_below_ns = inline_below_ns
        self.runs = 0
        self.exec_ns = 0.0  # moving average of one execution's CPU time on its thread
        self.wall_ns = 0.0  # moving average of its wall time

    @property
    def inline(self) -> bool:
        """Whether batches now run on the event loop (measured fast enough), not the executor."""
        return (
            self.runs >= PROBE_RUNS
            and self.exec_ns < self.inline_below_ns
            and self.wall_ns < self.inline_below_ns * WALL_FACTOR
        )

    def measured(self, ns: int, wall_ns: int) -> None:
        """Record one execution: `ns` of CPU time on its thread, `wall_ns` of wall time."""
        # One writer at a time per instance thread; a lost update only delays the switch.
        first = self.runs == 0
        self.exec_ns = ns if first else 0.75 * self.exec_ns + 0.25 * ns
        self.wall_ns = wall_ns if first else 0.75 * self.wall_ns + 0.25 * wall_ns
        self.runs += 1
