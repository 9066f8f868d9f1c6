"""An `execute` driven from the event loop: no executor thread for the common case.

A thread hand-off costs two wake-ups per call (the loop waking an executor thread, and that
thread waking the loop with the answer), each also a fight for the GIL. For a Python model most
calls are one EXECUTE and one RESULT, so the event loop sends EXECUTE itself and watches the
worker's pipe (`loop.add_reader`); the answer is read, checked and returned on the loop.

The loop never blocks on the worker: it reads only what already waits in the socket
(`ipc.receive_waiting`: two reads for a whole frame, no FIONREAD first). Everything that needs
waiting or blocking moves to a thread, at the point it shows, and the thread carries on exactly
where the loop stopped (`Handoff`):

* a BLS call, a BLS cancel, a metric query, or any other unexpected message;
* a frame that has not fully arrived (a large result still streaming in);
* the pipe closing or breaking (the thread reaps the worker and words the failure);
* no answer within `execute_timeout_seconds` (the thread kills the worker).

Log lines, custom metrics and heartbeat answers are handled on the loop (`on_side` returns
True). A cancelled request is told to the worker from the loop while it holds the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

from agent.backends.cancellation import CancelSignal
from agent.backends.python import ipc

__all__ = ["Handoff", "LoopCall"]

T = TypeVar("T")

# Carries on on a thread: the first message to handle (a reader of it) or None, the deadline.
Handoff = Callable[[Callable[[], ipc.Message] | None, float], T]


class LoopCall(Generic[T]):
    """One EXECUTE (number `seq`) already sent on `conn`, awaited on the event loop (see the
    module); `send` is the worker's (its lock), for CANCEL."""

    __slots__ = (
        "_active",
        "_conn",
        "_deadline",
        "_executor",
        "_finish",
        "_handoff_to",
        "_loop",
        "_on_side",
        "_send",
        "_seq",
        "_signals",
        "_timer",
        "_told",
        "future",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        executor: Executor,
        conn: ipc.HasFileno,
        send: Callable[[ipc.Message], None],
        seq: int,
        cancelled: Sequence[CancelSignal],
        timeout_s: float,
        on_side: Callable[[ipc.Message], bool],
        finish: Callable[[ipc.Message], T],
        handoff: Handoff[T],
    ) -> None:
        """`finish` turns RESULT or ERROR into the answer (on the loop); `handoff` runs on a
        thread of `executor` for everything else. One of them is called, once."""
        self.future: asyncio.Future[T] = loop.create_future()
        self._loop = loop
        self._executor = executor
        self._conn = conn
        self._send = send
        self._seq = seq
        self._signals = cancelled
        self._told: set[int] = set()
        self._on_side = on_side
        self._finish = finish
        self._handoff_to = handoff
        self._deadline = time.monotonic() + timeout_s
        self._active = True
        loop.add_reader(conn.fileno(), self._readable)
        self._timer = loop.call_later(timeout_s, self._handoff, None)
        for signal in cancelled:
            signal.on_cancel(self._cancelled_soon)

    def _readable(self) -> None:
        try:
            message = ipc.receive_waiting(self._conn)
        except EOFError:  # hung up: the thread says why
            self._handoff(None)
            return
        except (OSError, ipc.WireError) as exc:
            self._handoff(_raiser(exc))
            return
        if message is None:
            return  # woken for nothing
        if not isinstance(message, ipc.Message):  # still streaming in: a thread waits for it
            rest, deadline = message, self._deadline
            self._handoff(lambda: rest(deadline))
            return
        if message.kind not in (ipc.RESULT, ipc.ERROR):
            if not self._on_side(message):
                self._handoff(lambda: message)
            return
        self._stop()
        try:
            self.future.set_result(self._finish(message))
        except BaseException as exc:  # noqa: BLE001 - the caller's to handle, as on a thread
            self.future.set_exception(exc)

    def _handoff(self, pending: Callable[[], ipc.Message] | None) -> None:
        if not self._active:
            return
        self._stop()
        deadline = self._deadline
        thread = self._loop.run_in_executor(self._executor, self._handoff_to, pending, deadline)
        thread.add_done_callback(self._copy)

    def _copy(self, thread: asyncio.Future[T]) -> None:
        if self.future.done():
            return
        error = thread.exception()
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(thread.result())

    def _stop(self) -> None:
        self._active = False
        self._timer.cancel()
        with contextlib.suppress(OSError, ValueError):  # closed under it (the model unloads)
            self._loop.remove_reader(self._conn.fileno())

    def _cancelled_soon(self) -> None:
        """A request was cancelled (any thread): the loop tells the worker."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to tell
            self._loop.call_soon_threadsafe(self._tell_cancelled)

    def _tell_cancelled(self) -> None:
        if not self._active:
            return  # answered, or a thread carries on (it tells them itself)
        new = [i for i, s in enumerate(self._signals) if s.cancelled and i not in self._told]
        if not new:
            return
        self._told.update(new)
        with contextlib.suppress(OSError):  # gone: the reader sees it
            self._send(ipc.Message(ipc.CANCEL, {"seq": self._seq, "requests": new}))


def _raiser(exc: BaseException) -> Callable[[], ipc.Message]:
    def read() -> ipc.Message:
        raise exc

    return read
