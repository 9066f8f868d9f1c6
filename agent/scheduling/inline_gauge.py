"""When a scheduler should run its batches on the event loop instead of the executor.

The hand-off to an executor thread costs tens of microseconds; for a model that computes
faster than that, running on the loop is cheaper. Both schedulers (`agent.scheduling.scheduler`
and `agent.scheduling.sequence_scheduler`) measure their executions and switch once they are
cheap enough. Pure: the callers pass the times they measured and where the execution ran.

Two figures decide, each with a bar to enter the loop and a higher one to leave it, so a
version near a bar does not flip at every execution (each flip back costs hand-offs):
- CPU time on the executing thread (a moving average): waits and preemption do not stretch
  it, so it is trusted wherever it was measured; but caches shared with a busy loop do (the
  benchmark MLP: 11 µs alone, 60-110 µs under load). In under `inline_below_ns`, out at
  `LEAVE_FACTOR` times that.
- Wall time (a GPU model waits for its device without using CPU, and must not block the loop
  while it does). Measured on the executor it also holds the wait for the GIL after the
  backend returns, which on a busy event loop reaches milliseconds: it is only an upper bound
  there. So a version moves inline when the *smallest* wall time of its recent executor runs is
  under the wall limit, and moves back only when two inline executions in a row took
  `LEAVE_FACTOR` times it: one preemption by the OS (a time slice is milliseconds on a loaded
  machine) does not move a tiny model off the loop, and a model that really waits for a device
  leaves after two executions.
"""

from __future__ import annotations

PROBE_RUNS = 4  # executions measured on the executor before inline is considered
WALL_FACTOR = 10  # wall-time limit for inline, as a multiple of the CPU-time limit
WALL_WINDOW = 8  # recent executor runs whose smallest wall time is compared with the limit
LEAVE_FACTOR = 2  # the bars to leave the loop, as multiples of those to enter it
SLOW_RUNS_TO_LEAVE = 2  # consecutive slow inline executions that move a version back


class InlineGauge:
    """The measured cost of a version's executions, and the verdict: inline or executor."""

    def __init__(self, inline_below_ns: int) -> None:
        self.inline_below_ns = inline_below_ns
        self.runs = 0
        self.exec_ns = 0.0  # moving average of one execution's CPU time on its thread
        self.inline = False  # whether batches now run on the event loop, not the executor
        self._executor_walls: list[int] = []  # the last WALL_WINDOW, oldest first
        self._slow_inline = 0  # consecutive inline executions over the leaving wall limit

    @property
    def wall_limit_ns(self) -> int:
        """An execution slower than this (wall time) keeps its version on the executor."""
        return self.inline_below_ns * WALL_FACTOR

    def measured(self, ns: int, wall_ns: int, *, on_loop: bool) -> None:
        """Record one execution: `ns` of CPU time on its thread, `wall_ns` of wall time inside
        the backend, run on the event loop (`on_loop`) or on an executor thread."""
        # Executor threads may write concurrently; a lost update only delays a switch.
        self.exec_ns = ns if self.runs == 0 else 0.75 * self.exec_ns + 0.25 * ns
        self.runs += 1
        if on_loop:
            slow = wall_ns >= self.wall_limit_ns * LEAVE_FACTOR
            self._slow_inline = self._slow_inline + 1 if slow else 0
            if (
                self.exec_ns >= self.inline_below_ns * LEAVE_FACTOR
                or self._slow_inline >= SLOW_RUNS_TO_LEAVE
            ):
                self._leave(wall_ns)
            return
        walls = [*self._executor_walls[-(WALL_WINDOW - 1) :], wall_ns]
        self._executor_walls = walls
        if (
            not self.inline
            and self.exec_ns < self.inline_below_ns
            and self.runs >= PROBE_RUNS
            and min(walls) < self.wall_limit_ns
        ):
            self.inline = True
            self._slow_inline = 0

    def _leave(self, wall_ns: int) -> None:
        self.inline = False
        self._slow_inline = 0
        # The executor's record starts over from what the loop just measured: the version
        # comes back only after executor runs whose wall time shows it is fast again.
        self._executor_walls = [wall_ns]
