"""BLS requests of a decoupled Python model, on the agent side (`agent.backends.python.bls`).

A decoupled model may make BLS requests from `execute` and, as Triton allows, from its own
threads after `execute` returned, so they cannot be served by the loop that waits for an
`execute` answer (as for other models). The worker's pipe reader (`python_stream`) hands each
BLS and BLS_CANCEL message to `BlsRelay.handle` as it arrives: the request is started through
the data plane at once, and its answer (each response, for `decoupled=True`) is sent back when
it comes, from the thread that completes it (the agent's event loop; the channel serializes
sends). Cancelling a call (BLS_CANCEL) cancels the child request.

Bounds: a call's `timeout` bounds its wait in the called model's queue (the data plane's
request timeout); there is no bound from `execute_timeout_seconds`, as the call may outlive
`execute`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

from agent.backends.python import ipc
from agent.backends.python.bls import (
    CANCELLED,
    BlsRunner,
    failure_text,
    infer_request_of,
    start_child,
)
from agent.errors import AgentError
from agent.tensors.request import InferResponse


class BlsRelay:
    """The BLS calls of one decoupled worker, each answered as it completes."""

    def __init__(self, runner: BlsRunner | None, send: Callable[[ipc.Message], None]) -> None:
        self._runner = runner
        self._send = send
        self._lock = threading.Lock()
        self._calls: dict[Any, Future[Any]] = {}

    def handle(self, message: ipc.Message) -> None:
        """A BLS or BLS_CANCEL message from the worker (its pipe reader's thread)."""
        call_id = message.meta.get("id")
        if message.kind == ipc.BLS_CANCEL:
            with self._lock:
                running = self._calls.pop(call_id, None)
            if running is not None:
                running.cancel()
            return
        meta = message.meta
        model = str(meta.get("model", ""))
        streamed = bool(meta.get("decoupled"))
        if self._runner is None:
            text = "BLS needs the agent's data plane, which is not running"
            self._reply(call_id, error=text, final=streamed or None)
            return
        ended = [False]

        def on_item(response: InferResponse | None, error: AgentError | None, final: bool) -> None:
            ended[0] = final
            if error is not None:
                self._reply(call_id, error=failure_text(model, error), final=final)
            elif response is not None:
                tensors = [(o.name, o.data) for o in response.outputs]
                self._reply(call_id, tensors=tensors, final=final)
            else:
                self._reply(call_id, final=final)

        try:
            timeout_us = meta.get("timeout_us") or 0
            own = isinstance(timeout_us, int) and timeout_us > 0
            request = infer_request_of(message, timeout_us if own else None)
            future = start_child(self._runner, model, meta, request, on_item if streamed else None)
        except (AgentError, TypeError, ValueError) as exc:
            self._reply(call_id, error=failure_text(model, exc), final=streamed or None)
            return
        with self._lock:
            self._calls[call_id] = future
        future.add_done_callback(lambda done: self._done(call_id, model, streamed, ended, done))

    def _done(
        self, call_id: Any, model: str, streamed: bool, ended: list[bool], future: Future[Any]
    ) -> None:
        with self._lock:
            self._calls.pop(call_id, None)
        final = True if streamed else None
        try:
            result = future.result()
        except CancelledError:
            if streamed and not ended[0]:
                self._reply(call_id, error=CANCELLED, final=True)
            return
        except Exception as exc:  # noqa: BLE001 - any failure is that request's error
            self._reply(call_id, error=failure_text(model, exc), final=final)
            return
        if streamed:
            if not ended[0]:
                self._reply(call_id, final=True)
            return
        self._reply(call_id, tensors=[(o.name, o.data) for o in result.outputs])

    def _reply(
        self,
        call_id: Any,
        *,
        error: str | None = None,
        tensors: list[tuple[str, Any]] | None = None,
        final: bool | None = None,
    ) -> None:
        meta: dict[str, Any] = {"id": call_id}
        if error is not None:
            meta["error"] = error
        if final is not None:
            meta["final"] = final
        with contextlib.suppress(OSError):  # the worker is gone: nobody waits for it
            self._send(ipc.Message(ipc.BLS_RESULT, meta, tensors or []))
