"""The worker's reading end of the pipe: read by the main thread while it waits for work, and
by a relief thread while the main thread is busy for long or waits for a reply.

Why the pipe must be read while `execute` runs: the agent blocks while it writes a message
larger than the socket buffer. If the worker only read when some call waited for an answer, a
BLS result the model never awaits (an abandoned `async_exec`) could fill the pipe while the
worker writes its own answer, and each side would wait for the other for ever. The heartbeat's
PINGs and CANCELs must also get through while a long `execute` runs.

Why the main thread reads for itself: a reader thread handing every message to the main thread
costs two thread wake-ups and a hand-over of the GIL per call, more than a small model's
`execute`. So the main thread reads while it waits (`receive`), and the relief thread takes the
pipe over only when the main thread has been out of `receive` at two of its checks in a row
(_CHECK_S apart: an `execute` longer than _CHECK_S to 2 * _CHECK_S), or at once when a call
waits for its reply (`expect`, `expect_stream`: BLS, `Metric.value()`). A short `execute`
therefore costs no thread switch, and the agent's writes still always finish (`python_ipc`, flow
control). While the relief thread has the pipe, it hands the next message for the main loop
over through a queue, and the pipe with it.

Invariants: at most one thread reads the pipe at a time (`_state` says which); a message read
is filed exactly once, in the order read. The relief thread sleeps without waking (parked) once
the main thread has waited in `receive` for _PARK_AFTER checks; leaving `receive` wakes it.

What the reader does with each message:

* a reply to a call (BLS_RESULT, METRIC_VALUE_RESULT, meta {"id"}) goes to the slot that call
  registered with `expect`, as a `concurrent.futures.Future`, or, for a streamed BLS call
  (`expect_stream`), to its callback, reply after reply until one says "final"; a reply nobody
  waits for (the call was abandoned or cancelled) is dropped at once, so its tensors are freed;
* CANCEL goes to the `on_cancel` callback (it marks requests of the running `execute`);
* PING goes to the `on_ping` callback (a thread of its own answers it: a reader never writes);
* anything else (EXECUTE, FINALIZE ...) is for the main loop: `receive` returns it, in order.

When the pipe closes or breaks, every waiting call gets an error reply and `receive` raises.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import Connection

from agent.backends.python import ipc

_REPLIES = (ipc.BLS_RESULT, ipc.METRIC_VALUE_RESULT)
# How often the relief thread looks whether the main thread is busy: bounds how late a PING or
# CANCEL is read during a long `execute` (2 * _CHECK_S at most).
_CHECK_S = 0.01
_PARK_AFTER = 100  # checks the main thread spent waiting in `receive` before the relief parks


class Mailbox:
    """Reads `conn` from `receive` and, after `start`, on a relief thread; files each message."""

    def __init__(
        self,
        conn: Connection,
        on_cancel: Callable[[ipc.Message], None] | None = None,
        on_ping: Callable[[ipc.Message], None] | None = None,
    ) -> None:
        self._frames = ipc.FrameReader(conn)  # read by one thread at a time (see above)
        self._on_cancel = on_cancel
        self._on_ping = on_ping
        self._lock = threading.Lock()
        self._slots: dict[int, Future[ipc.Message]] = {}
        # Streamed calls (BLS with decoupled=True): every reply until one with meta "final".
        self._streams: dict[int, Callable[[ipc.Message], None]] = {}
        self._failure: BaseException | None = None
        # Who reads, guarded by _state: the relief thread while `_relieved`, else the main
        # thread (only inside `receive`: `_waiting`). `_left` counts the main thread's exits
        # from `receive` (the relief's checks compare it).
        self._state = threading.Lock()
        self._relieved = False
        self._waiting = False
        self._left = 0
        self._parked = False
        self._signalled = False
        self._wake = threading.Lock()  # released (once per `_signalled`) to wake the relief
        self._wake.acquire()
        # Messages for the main loop that the relief thread read; after the pipe failed, the
        # failure (every later `receive` raises it). A C queue: the main loop wakes in few steps.
        self._handed: queue.SimpleQueue[ipc.Message | BaseException] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._relieve, name="pipe-relief", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def receive(self) -> ipc.Message:
        """The next message that is not a reply (main loop); replies, CANCEL and PING read
        meanwhile are filed on the way.

        Raises:
            EOFError, OSError, ipc.WireError: the pipe closed or broke (as `ipc.receive`).
        """
        with self._state:
            relieved = self._relieved
            self._waiting = True
        try:
            if relieved or not self._handed.empty():
                item = self._handed.get()
                if isinstance(item, BaseException):
                    self._handed.put(item)  # for the next `receive`
                    raise item
                return item
            while True:
                message = self._read()
                if self._file(message):
                    return message
        finally:
            with self._state:
                self._waiting = False
                self._left += 1
                wake = self._parked or self._calls_waiting()
            if wake:
                self._signal()

    def expect(self, call_id: int) -> Future[ipc.Message]:
        """A slot for the reply to `call_id`; register it before sending the call."""
        slot: Future[ipc.Message] = Future()
        with self._lock:
            if self._failure is not None:
                _fill(slot, call_id, f"the agent is gone: {self._failure}")
                return slot
            self._slots[call_id] = slot
        self._signal()  # the reply must be read even while the main thread is busy
        return slot

    def expect_stream(self, call_id: int, deliver: Callable[[ipc.Message], None]) -> None:
        """Hand every reply to `call_id` to `deliver` (the reading thread) until a final one."""
        with self._lock:
            failure = self._failure
            if failure is None:
                self._streams[call_id] = deliver
        if failure is not None:
            deliver(_error(call_id, f"the agent is gone: {failure}"))
        else:
            self._signal()

    def forget(self, call_id: int) -> None:
        """Nobody waits for `call_id` any more: its replies will be dropped on arrival."""
        with self._lock:
            self._slots.pop(call_id, None)
            self._streams.pop(call_id, None)

    def abandon(self, reason: str) -> None:
        """Answer every waiting call with an error (the `execute` that made them returned)."""
        if not self._slots and not self._streams:
            return  # most executes make no calls (one made meanwhile comes after this anyway)
        with self._lock:
            slots, self._slots = self._slots, {}
            streams, self._streams = self._streams, {}
        for call_id, slot in slots.items():
            _fill(slot, call_id, reason)
        for call_id, deliver in streams.items():
            deliver(_error(call_id, reason))

    def _calls_waiting(self) -> bool:
        return bool(self._slots or self._streams)

    def _signal(self) -> None:
        """Wake the relief thread (at most one wake-up pending)."""
        with self._state:
            if not self._signalled:
                self._signalled = True
                self._wake.release()

    def _relieve(self) -> None:
        """The relief thread: take the pipe over while the main thread is busy (see above)."""
        seen = -1  # `_left` at the previous check: unchanged while one busy spell lasts
        waited = 0  # checks in a row that found the main thread waiting in `receive`
        while True:
            woken = self._wake.acquire(timeout=-1 if self._parked else _CHECK_S)
            with self._state:
                if woken:
                    self._signalled = False
                self._parked = False
                if self._failure is not None:
                    return
                if self._waiting:
                    seen = -1
                    waited += 1
                    self._parked = waited >= _PARK_AFTER and not self._calls_waiting()
                    continue
                waited = 0
                if self._left != seen and not self._calls_waiting():
                    seen = self._left  # busy since the last check at most: look again
                    continue
                self._relieved = True
            seen = -1
            if not self._read_for_main():
                return

    def _read_for_main(self) -> bool:
        """Read (relief thread) until a message for the main loop, which goes to it with the
        pipe; False when the pipe failed."""
        while True:
            try:
                message = self._read()
            except Exception:  # noqa: BLE001 - filed by `_read`: every `receive` raises it
                return False
            if self._file(message):
                self._handed.put(message)
                with self._state:
                    self._relieved = False
                return True

    def _read(self) -> ipc.Message:
        """One message off the pipe (by the one thread that reads now).

        Raises:
            EOFError, OSError, ipc.WireError, MemoryError ...: the pipe is done; the failure is
            kept for every later `receive`, and every waiting call is answered with it.
        """
        try:
            return self._frames.receive()
        except Exception as exc:
            with self._lock:
                self._failure = exc
            self._handed.put(exc)
            self.abandon(f"the agent is gone: {exc!r}")
            raise

    def _file(self, message: ipc.Message) -> bool:
        """Deliver a reply, CANCEL or PING where it goes; True: the message is the main loop's."""
        kind = message.kind
        if kind in _REPLIES:
            call_id = _id(message)
            with self._lock:
                slot = self._slots.pop(call_id, None)
                deliver = self._streams.get(call_id)
                if deliver is not None and message.meta.get("final", True):
                    del self._streams[call_id]
            if slot is not None:  # else abandoned: dropped here, its memory with it
                _set(slot, message)
            elif deliver is not None:
                deliver(message)
        elif kind == ipc.CANCEL:
            if self._on_cancel is not None:
                self._on_cancel(message)
        elif kind == ipc.PING:
            if self._on_ping is not None:
                self._on_ping(message)
        else:
            return True
        return False


def _id(message: ipc.Message) -> int:
    value = message.meta.get("id")
    return value if isinstance(value, int) else -1


def _error(call_id: int, reason: str) -> ipc.Message:
    return ipc.Message(ipc.BLS_RESULT, {"id": call_id, "error": reason, "final": True})


def _fill(slot: Future[ipc.Message], call_id: int, reason: str) -> None:
    _set(slot, _error(call_id, reason))


def _set(slot: Future[ipc.Message], message: ipc.Message) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled meanwhile by the model
        slot.set_result(message)
