"""The responses of one request, as the transports read them: `StreamedResponse` items.

`DataPlane.infer_stream` yields them for every model. A model that is not decoupled gives one
item (its response, final) straight from `DataPlane.infer`: no queue, no extra task. A decoupled
model gives zero or more responses, each an item, the last one flagged final (an item with
neither response nor error when the model sent the final flag alone).

`ResponseStream` is the bridge from the backend's threads to the event loop: the backend puts
into it from its reader thread (`agent.backends.base.ResponseSink`), the data plane iterates it
on the loop; `cancel` tells the backend the client went away (the model's
`request.is_cancelled()` turns true).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from agent.errors import AgentError
from agent.tensors.request import InferResponse


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One response of a request (or its error), or the final flag alone."""

    response: InferResponse | None
    error: AgentError | None = None
    final: bool = True


@dataclass(frozen=True, slots=True)
class RawResponse:
    """What the backend sent: outputs by name (in the model's order), or an error; the final
    flag."""

    outputs: dict[str, np.ndarray] | None
    error: AgentError | None
    final: bool


class ResponseStream:
    """A request's responses from any thread to one reader on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[RawResponse] = asyncio.Queue()
        self._lock = threading.Lock()
        self._cancel: Callable[[], None] | None = None
        self.cancelled = False
        self.finished = False

    def put(
        self, outputs: dict[str, np.ndarray] | None, error: AgentError | None, final: bool
    ) -> None:
        """A response from the backend (any thread)."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, RawResponse(outputs, error, final))

    def on_cancel(self, cancel: Callable[[], None]) -> None:
        with self._lock:
            if not self.cancelled:
                self._cancel = cancel
                return
        cancel()

    def cancel(self) -> None:
        """The client went away: tell the model (once)."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()

    async def __aiter__(self) -> AsyncIterator[RawResponse]:
        while not self.finished:
            item = await self._queue.get()
            self.finished = item.final
            yield item
