"""BLS on the worker side: `pb_utils.InferenceRequest.exec` and `async_exec` inside a Python
model's worker (the agent side, and the protocol, are in `agent.backends.python.bls`).

`BlsClient.submit` sends a BLS message and returns a future that the worker's pipe reader
(`python_mailbox`) completes with the BLS_RESULT of the same id. `exec` waits on it;
`async_exec` awaits it (`asyncio.wrap_future`), so several calls may be in flight at once
(`asyncio.gather`) without a thread each. Cancelling the awaiting task cancels the future, which
sends BLS_CANCEL; the agent then cancels the child request. Results of calls nobody waits for
any more are dropped as they arrive. With `decoupled=True` the future gets a `ResponseIterator`
once the first response came; each BLS_RESULT of the call (until one says "final") is one
response.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from typing import Any

from agent import pb_utils
from agent.backends.python import ipc
from agent.backends.python.worker.mailbox import Mailbox


class BlsClient:
    """`pb_utils.InferenceRequest.exec` / `async_exec` inside the worker, between `begin` and
    `end`. Replies arrive in the `Mailbox` slots; ids are shared with other calls to the agent."""

    def __init__(
        self, send: Callable[[ipc.Message], None], mailbox: Mailbox, ids: Iterator[int]
    ) -> None:
        self._send = send
        self._mailbox = mailbox
        self._ids = ids

    def begin(self) -> None:
        pb_utils.set_bls_runner(self.submit)

    def end(self) -> None:
        pb_utils.set_bls_runner(None)
        self._mailbox.abandon("the execute call that made this request returned")

    def submit(self, request: pb_utils.InferenceRequest, decoupled: bool = False) -> Future[Any]:
        """Send one request to the agent; the future gets its response, or an error response.
        `decoupled`: the future gets a `ResponseIterator` once the first response came.

        Cancelling the future (the model's asyncio task awaiting `async_exec` was cancelled)
        tells the agent, which cancels the child request.
        """
        tensors = []
        for tensor in request.inputs():
            if not isinstance(tensor, pb_utils.Tensor):
                raise pb_utils.TritonModelException(
                    f"BLS inputs must be pb_utils.Tensor, got {type(tensor).__name__}"
                )
            tensors.append((tensor.name(), tensor.as_numpy()))
        call_id = next(self._ids)
        meta = {
            "id": call_id,
            "model": request.model_name(),
            "version": request.model_version(),
            "outputs": request.requested_output_names(),
            "timeout_us": request.timeout(),
            "parameters": request.parameters(),
            "request_id": request.request_id(),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
        }
        trace = request.trace()
        if isinstance(trace, pb_utils.InferenceTrace) and trace.index is not None:
            meta["trace"] = trace.index  # the parent: which request of this execute call
        if decoupled:
            meta["decoupled"] = True
            return self._stream(call_id, meta, tensors)
        response: Future[pb_utils.InferenceResponse] = Future()
        slot = self._mailbox.expect(call_id)
        slot.add_done_callback(lambda done: _deliver(response, done))
        response.add_done_callback(lambda done: self._cancelled(call_id, done))
        try:
            self._send(ipc.Message(ipc.BLS, meta, tensors))
        except (OSError, ValueError) as exc:
            self._mailbox.forget(call_id)
            _settle(response, _error_response(f"BLS failed: {exc}"))
        return response

    def _stream(
        self, call_id: int, meta: dict[str, Any], tensors: list[tuple[str, Any]]
    ) -> Future[ResponseIterator]:
        responses = ResponseIterator(lambda: self._cancel(call_id))
        self._mailbox.expect_stream(call_id, responses.deliver)
        responses.started.add_done_callback(lambda done: self._cancelled(call_id, done))
        try:
            self._send(ipc.Message(ipc.BLS, meta, tensors))
        except (OSError, ValueError) as exc:
            self._mailbox.forget(call_id)
            error = {"id": call_id, "error": f"BLS failed: {exc}", "final": True}
            responses.deliver(ipc.Message(ipc.BLS_RESULT, error))
        return responses.started

    def _cancelled(self, call_id: int, response: Future[Any]) -> None:
        if response.cancelled():
            self._cancel(call_id)

    def _cancel(self, call_id: int) -> None:
        self._mailbox.forget(call_id)
        with contextlib.suppress(OSError):  # the agent is gone: nothing left to cancel
            self._send(ipc.Message(ipc.BLS_CANCEL, {"id": call_id}))


class ResponseIterator:
    """The responses of a BLS call with `decoupled=True`, as Triton's python_backend gives them:
    iterate it (`for`, blocking) or, in an `async def execute`, `async for`. It ends after the
    response with the final flag; a final flag sent alone comes as an empty response.
    `cancel()` cancels the request."""

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._ready: deque[tuple[pb_utils.InferenceResponse, bool]] = deque()
        self._waiters: deque[Future[tuple[pb_utils.InferenceResponse, bool]]] = deque()
        self._done = False
        self.started: Future[ResponseIterator] = Future()  # set at the first response

    def deliver(self, message: ipc.Message) -> None:
        """One reply from the agent (the thread reading the pipe)."""
        item = (_response_of(message), bool(message.meta.get("final", True)))
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                with contextlib.suppress(InvalidStateError):  # its awaiting task was cancelled
                    waiter.set_result(item)
                    break
            else:
                self._ready.append(item)
        with contextlib.suppress(InvalidStateError):
            self.started.set_result(self)

    def cancel(self) -> None:
        """Cancel the request (Triton's `ResponseIterator.cancel`); the stream then ends."""
        self._cancel()
        self.deliver(ipc.Message(ipc.BLS_RESULT, {"id": -1, "error": ipc.CANCELLED, "final": True}))

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        if self._done:
            raise StopIteration
        response, self._done = self._next().result()
        return response

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> pb_utils.InferenceResponse:
        import asyncio  # noqa: PLC0415 - only models with async execute need it

        if self._done:
            raise StopAsyncIteration
        response, self._done = await asyncio.wrap_future(self._next())
        return response

    def _next(self) -> Future[tuple[pb_utils.InferenceResponse, bool]]:
        waiter: Future[tuple[pb_utils.InferenceResponse, bool]] = Future()
        with self._lock:
            if self._ready:
                waiter.set_result(self._ready.popleft())
            else:
                self._waiters.append(waiter)
        return waiter


def _response_of(reply: ipc.Message) -> pb_utils.InferenceResponse:
    if "error" in reply.meta:
        return _error_response(str(reply.meta["error"]))
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in reply.tensors])


def _deliver(response: Future[pb_utils.InferenceResponse], slot: Future[ipc.Message]) -> None:
    _settle(response, _response_of(slot.result()))


def _error_response(text: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(text))


def _settle(future: Future[pb_utils.InferenceResponse], value: pb_utils.InferenceResponse) -> None:
    with contextlib.suppress(InvalidStateError):  # the model cancelled it meanwhile
        future.set_result(value)
