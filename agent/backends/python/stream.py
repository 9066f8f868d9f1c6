"""Agent side of a decoupled Python model's worker: the pipe read by one thread of its own.

A decoupled model sends responses whenever it likes, also after `execute` returned and while
the worker waits for its next batch, so the pipe cannot be read only while an `execute` call is
awaited (as for other models). `DecoupledChannel` owns the reading end from READY to close:

* RESPONSE messages go straight to their request's `ResponseSink`, checked against the config's
  outputs; the final flag closes the request;
* LOG, METRICS, BLS and BLS_CANCEL go to the backend's handler (BLS requests are served at any
  time: `python_bls_relay`); every other message (RESULT, ERROR, FINALIZED) waits in the inbox
  for the thread that runs `execute` or `close`;
* when the pipe fails (the worker died or was killed), every open request ends with the
  reason, as a ModelInstanceFailedError response with the final flag.

Sends go through the worker's one lock (`Worker.send`): the executor thread sends EXECUTE, the
event loop CANCEL, the supervisor its heartbeat PINGs; the PONGs come back here like any side
message.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from agent.backends.base import DecoupledRequest, ModelOutputs, ResponseSink
from agent.backends.python import ipc
from agent.errors import AgentError, BackendError, ModelInstanceFailedError, ModelNotReadyError
from agent.tensors.request import RequestContext

logger = logging.getLogger(__name__)

# The requested outputs of a response that the model returned, checked (dtype, shape), in the
# model's order; raises BackendError.
OutputCheck = Callable[[Sequence[str], dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(slots=True)
class _Open:
    sink: ResponseSink
    outputs: Sequence[str]


class NotSent(Exception):
    """EXECUTE did not reach the worker (it is gone), and none of its requests was answered."""


class DecoupledChannel:
    """One decoupled worker's pipe: a reader thread, an inbox and the open requests."""

    def __init__(
        self,
        conn: Connection,
        label: str,
        side_message: Callable[[ipc.Message], bool],
        check: OutputCheck,
        exit_reason: Callable[[], str],
        send: Callable[[ipc.Message], None],
    ) -> None:
        self._conn = conn
        self._side_message = side_message
        self._check = check
        self._exit_reason = exit_reason
        self._send = send  # the worker's, under its lock
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._inbox: queue.SimpleQueue[ipc.Message | BaseException] = queue.SimpleQueue()
        self.last_activity = time.monotonic()  # any message: the worker is alive
        self.closing = False  # set by the backend before it finalizes: EOF is expected
        self._thread = threading.Thread(target=self._pump, name=f"pipe-{label}", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait for the reader thread to end (the worker is gone: EOF), bounded."""
        self._thread.join(timeout_s)

    def send(self, message: ipc.Message) -> None:
        """Send to the worker. Raises OSError when it is gone."""
        self._send(message)

    def receive(self, deadline: float | None) -> ipc.Message:
        """The next message for the executor (RESULT, ERROR, FINALIZED ...).

        Raises:
            TimeoutError: none before `deadline` (a `time.monotonic()` instant).
            EOFError, OSError, ipc.WireError: the pipe failed.
        """
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no message before the deadline") from None
        if isinstance(item, BaseException):
            self._inbox.put(item)  # every later receive fails the same way
            raise item
        return item

    def execute(
        self,
        requests: Sequence[tuple[int, DecoupledRequest]],
        execute_s: float,
        contexts: Sequence[RequestContext | None] = (),
    ) -> ipc.Message:
        """Send one EXECUTE with these (id, request) and wait until `execute` returned: its
        RESULT or ERROR. The wait restarts with every message from the worker (a model that
        streams from inside `execute` is alive).

        Raises:
            NotSent: the worker was gone before EXECUTE reached it, and no sink was told
                anything (the requests can go to another worker).
            TimeoutError: nothing from the worker for `execute_s`.
            EOFError, OSError, ipc.WireError: the pipe failed.
        """
        if not self._thread.is_alive():
            raise NotSent  # its reader saw the pipe end: the worker is gone
        described: list[dict[str, object]] = []
        for request_id, (feeds, names, sink) in requests:
            self.open(request_id, sink, names)
            described.append({"id": request_id, "outputs": list(names), "inputs": len(feeds)})
        for index, context in enumerate(contexts):  # what the model's request_id() etc. answer
            if context is not None:
                described[index].update(
                    request_id=context.id,
                    parameters=dict(context.parameters),
                    correlation_id=context.correlation_id,
                )
        tensors = [item for _, (feeds, _, _) in requests for item in feeds.items()]
        try:
            self.send(ipc.Message(ipc.EXECUTE, {"requests": described}, tensors))
        except OSError:
            with self._lock:  # unless the reader ended them already (then they were told)
                if all(request_id in self._open for request_id, _ in requests):
                    for request_id, _ in requests:
                        del self._open[request_id]
                    raise NotSent from None
            raise
        for request_id, (_, _, sink) in requests:
            self.watch_cancel(request_id, sink)
        waited_from = time.monotonic()
        while True:
            try:
                reply = self.receive(waited_from + execute_s)
            except TimeoutError:
                if self.last_activity <= waited_from:
                    raise
                waited_from = self.last_activity
                continue
            return reply

    def open(self, request_id: int, sink: ResponseSink, outputs: Sequence[str]) -> None:
        """Route the responses of `request_id` to `sink` until its final flag."""
        with self._lock:
            self._open[request_id] = _Open(sink, outputs)

    def watch_cancel(self, request_id: int, sink: ResponseSink) -> None:
        """Tell the worker when the client cancels (after EXECUTE went: ids are known there)."""
        sink.on_cancel(lambda: self._cancel(request_id))

    def fail_all(self, error: AgentError, ids: Sequence[int] | None = None) -> None:
        """End open requests (all, or `ids`) with `error` and the final flag."""
        with self._lock:
            keys = list(self._open) if ids is None else [i for i in ids if i in self._open]
            ended = [self._open.pop(i) for i in keys]
        for entry in ended:
            entry.sink.put(None, error, True)

    def _cancel(self, request_id: int) -> None:
        with self._lock:
            if request_id not in self._open:
                return
        with contextlib.suppress(OSError):  # the worker is gone: the reader thread ends it
            self.send(ipc.Message(ipc.CANCEL, {"id": request_id}))

    def _pump(self) -> None:
        while True:
            try:
                message = ipc.receive(self._conn)
            except (EOFError, OSError, ipc.WireError) as exc:
                self._inbox.put(exc)
                if self.closing:
                    self.fail_all(ModelNotReadyError("the model was unloaded"))
                else:
                    self.fail_all(ModelInstanceFailedError(self._exit_reason()))
                return
            self.last_activity = time.monotonic()
            if message.kind == ipc.RESPONSE:
                self._route(message)
            elif not self._side_message(message):
                self._inbox.put(message)

    def _route(self, message: ipc.Message) -> None:
        request_id = int(message.meta.get("id", -1))
        final = bool(message.meta.get("final"))
        with self._lock:
            entry = self._open.pop(request_id, None) if final else self._open.get(request_id)
        if entry is None:
            return  # already ended (its worker failed it, or a stray id)
        if not message.meta.get("response"):
            entry.sink.put(None, None, final)
            return
        if "error" in message.meta:
            entry.sink.put(None, BackendError(str(message.meta["error"])), final)
            return
        try:
            outputs = self._check(entry.outputs, dict(message.tensors))
        except BackendError as exc:
            entry.sink.put(None, exc, final)
            return
        params = message.meta.get("parameters")
        if isinstance(params, dict) and params:  # InferenceResponse(parameters=...)
            outputs = ModelOutputs(outputs, params)
        entry.sink.put(outputs, None, final)
