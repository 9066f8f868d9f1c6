"""A request's cancellation, seen by the backend that runs it (Triton's request cancellation).

The scheduler makes one `CancelSignal` per request it hands to a backend that can act on it (the
Python backend: `InferenceRequest.is_cancelled()` in the model, and its BLS calls cancelled) and
cancels it, from the event loop, when the request's caller went away: the client disconnected,
the BLS call or ensemble step that made the request was cancelled. The backend reads it from its
executor thread and may register a callback to be woken.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelSignal:
    """Set once, from any thread; callbacks run in the thread that cancels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call `callback` when cancelled (at once when it already is)."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return
        callback()
