"""The worker's reading end of the pipe: one thread reads every message as soon as it arrives.

Why a thread of its own: the agent blocks while it writes a message larger than the socket
buffer. If the worker only read when some call waited for an answer, a BLS result the model
never awaits (an abandoned `async_exec`) could fill the pipe while the worker writes its own
answer, and each side would wait for the other for ever. Reading at all times means the agent's
writes always finish (`python_ipc`, flow control).

What the reader does with each message:

* a reply to a call (BLS_RESULT, METRIC_VALUE_RESULT, meta {"id"}) goes to the slot that call
  registered with `expect`, as a `concurrent.futures.Future`, or, for a streamed BLS call
  (`expect_stream`), to its callback, reply after reply until one says "final"; a reply nobody
  waits for (the call was abandoned or cancelled) is dropped at once, so its tensors are freed;
* CANCEL goes to the `on_cancel` callback (it marks requests of the running `execute`);
* PING goes to the `on_ping` callback (a thread of its own answers it: this one never writes);
* anything else (EXECUTE, FINALIZE ...) waits in order for the main loop's `receive`.

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


class Mailbox:
    """Reads `conn` on a daemon thread (after `start`) and files each message."""

    def __init__(
        self,
        conn: Connection,
        on_cancel: Callable[[ipc.Message], None] | None = None,
        on_ping: Callable[[ipc.Message], None] | None = None,
    ) -> None:
        self._conn = conn
        self._on_cancel = on_cancel
        self._on_ping = on_ping
        self._lock = threading.Lock()
        self._slots: dict[int, Future[ipc.Message]] = {}
        # Streamed calls (BLS with decoupled=True): every reply until one with meta "final".
        self._streams: dict[int, Callable[[ipc.Message], None]] = {}
        # A C queue, not a deque under the condition: the main loop wakes with fewer steps.
        # After the pipe failed, it ends with the failure (every later `receive` raises it).
        self._others: queue.SimpleQueue[ipc.Message | BaseException] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name="pipe-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def receive(self) -> ipc.Message:
        """The next message that is not a reply (main loop).

        Raises:
            EOFError, OSError, ipc.WireError: the pipe closed or broke (as `ipc.receive`).
        """
        item = self._others.get()
        if isinstance(item, BaseException):
            self._others.put(item)  # for the next `receive`
            raise item
        return item

    def expect(self, call_id: int) -> Future[ipc.Message]:
        """A slot for the reply to `call_id`; register it before sending the call."""
        slot: Future[ipc.Message] = Future()
        with self._lock:
            if self._failure is not None:
                _fill(slot, call_id, f"the agent is gone: {self._failure}")
            else:
                self._slots[call_id] = slot
        return slot

    def expect_stream(self, call_id: int, deliver: Callable[[ipc.Message], None]) -> None:
        """Hand every reply to `call_id` to `deliver` (reader thread) until a final one."""
        with self._lock:
            failure = self._failure
            if failure is None:
                self._streams[call_id] = deliver
        if failure is not None:
            deliver(_error(call_id, f"the agent is gone: {failure}"))

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

    def _read(self) -> None:
        while True:
            try:
                message = ipc.receive(self._conn)
            except Exception as exc:  # noqa: BLE001 - a reader dying silently would hang the worker
                # EOF (the agent is gone), OSError, WireError, MemoryError: the pipe is done.
                with self._lock:
                    self._failure = exc
                self._others.put(exc)
                self.abandon(f"the agent is gone: {exc!r}")
                return
            if message.kind in _REPLIES:
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
            elif message.kind == ipc.CANCEL:
                if self._on_cancel is not None:
                    self._on_cancel(message)
            elif message.kind == ipc.PING:
                if self._on_ping is not None:
                    self._on_ping(message)
            else:
                self._others.put(message)


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
