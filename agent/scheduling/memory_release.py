"""Give a model's runtime memory back once a burst of traffic is over.

ONNX Runtime's CPU arena grows to the largest batches a burst forms and keeps every chunk: after
perf_analyzer drove the bench's CNN at concurrency 32 the agent stayed ~500 MB above idle. A
backend with `release_memory()` (one small run that shrinks its arena, then the C heap trimmed)
gets it called on the model's executor once the model has been idle for `after_s` following
executions on the executor. Inline (tiny) models never arm it: their arenas stay small.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

logger = logging.getLogger(__name__)

RELEASE_AFTER_S = 1.0  # idle time after a burst before memory is handed back


class MemoryReleaser:
    """Arms a one-shot release when a model goes idle after work; new work disarms it."""

    def __init__(
        self,
        release: Callable[[], None] | None,
        executor: Executor,
        is_idle: Callable[[], bool],
        after_s: float = RELEASE_AFTER_S,
    ) -> None:
        self._release = release
        self._executor = executor
        self._is_idle = is_idle
        self._after_s = after_s
        self._handle: asyncio.TimerHandle | None = None
        self._dirty = False  # executions ran since the last release
        self.releases = 0

    def ran(self) -> None:
        """An execution ran on the executor (the arena may have grown)."""
        self._dirty = self._release is not None

    def idle(self) -> None:
        """The model has nothing queued or executing: release after `after_s` if still so."""
        if not self._dirty or self._handle is not None:
            return
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(self._after_s, self._fire, loop)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        if not self._is_idle():
            return  # busy again: the next idle moment re-arms
        self._dirty = False
        release = self._release
        assert release is not None
        loop.run_in_executor(self._executor, release).add_done_callback(self._done)

    def _done(self, future: asyncio.Future[None]) -> None:
        error = future.exception() if not future.cancelled() else None
        if error is not None:
            logger.debug("memory release failed: %s", error)
            return
        self.releases += 1
