"""BLS (Triton's business logic scripting): a Python model runs other models from `execute`.

Worker side: `pb_utils.InferenceRequest.exec` and `async_exec` go through `BlsClient.submit`,
which sends a BLS message and returns a future that the worker's pipe reader
(`python_mailbox`) completes with the BLS_RESULT of the same id. `exec` waits on it;
`async_exec` awaits it (`asyncio.wrap_future`), so several calls may be in flight at once
(`asyncio.gather`) without a thread each. Cancelling the awaiting task cancels the future, which
sends BLS_CANCEL; the agent then cancels the child request. Results of calls nobody waits for
any more are dropped as they arrive.

Agent side: while the backend waits for the answer to EXECUTE, `BlsCalls` starts each BLS
request it receives through the injected `BlsSubmit` (the data plane's `infer` on the agent's
event loop: the called model's scheduler batches it, its statistics count it, a canary may
route it) and sends each result back as it completes. A request built with
`trace=request.trace()` names which request of the `execute` call made it: when that request is
traced, the BLS request carries its trace (`InferRequest.parent_trace`) and is traced as its
child. Each call is bounded by its `timeout`
(microseconds) or, without one, by the calling model's `execute_timeout_seconds`: a call that
cannot run (a model calling itself while every instance is busy) ends with an error response,
never a hang. Failures come back as error responses worded as Triton's ("Failed for execute the
inference request. Model 'x' is not ready." for an unknown or unloaded model), never as a
failure of the calling model.

Cancellation, as Triton's: cancelling a call's future cancels the child's data-plane task, so
its scheduler skips it while queued or tells its backend while it runs. That happens when the
model cancels the call (BLS_CANCEL), when the execute ends with calls still running (abandoned,
timed out, or the worker died), and when every request of the execute was cancelled (its
client went away, or its own BLS caller was cancelled): the worker is then told with CANCEL
(`InferenceRequest.is_cancelled()`) and its calls are answered "Request was cancelled".

Limits: at most `MAX_IN_FLIGHT` calls per `execute` at once; tensors are bounded as every
message on the wire (`python_ipc`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from agent import pb_utils
from agent.backends import python_ipc as ipc
from agent.backends.cancellation import CancelSignal
from agent.backends.python_mailbox import Mailbox
from agent.errors import AgentError, ModelNotFoundError, ModelNotReadyError, RequestTimeoutError
from agent.tensors.request import InferInput, InferRequest, InferResponse, RequestedOutput

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
CANCELLED = "Request was cancelled"  # Triton's message for a cancelled request

# Runs a request on (model, version or None) from any thread; the future holds the response.
BlsSubmit = Callable[[str, str | None, InferRequest], "Future[InferResponse]"]


# ---------------------------------------------------------------- worker side


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

    def submit(self, request: pb_utils.InferenceRequest) -> Future[pb_utils.InferenceResponse]:
        """Send one request to the agent; the future gets its response, or an error response.

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
        }
        trace = request.trace()
        if isinstance(trace, pb_utils.InferenceTrace) and trace.index is not None:
            meta["trace"] = trace.index  # the parent: which request of this execute call
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

    def _cancelled(self, call_id: int, response: Future[pb_utils.InferenceResponse]) -> None:
        if not response.cancelled():
            return
        self._mailbox.forget(call_id)
        with contextlib.suppress(OSError):  # the agent is gone: nothing left to cancel
            self._send(ipc.Message(ipc.BLS_CANCEL, {"id": call_id}))


def _deliver(response: Future[pb_utils.InferenceResponse], slot: Future[ipc.Message]) -> None:
    reply = slot.result()
    if "error" in reply.meta:
        _settle(response, _error_response(str(reply.meta["error"])))
    else:
        _settle(
            response,
            pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in reply.tensors]),
        )


def _error_response(text: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(text))


def _settle(future: Future[pb_utils.InferenceResponse], value: pb_utils.InferenceResponse) -> None:
    with contextlib.suppress(InvalidStateError):  # the model cancelled it meanwhile
        future.set_result(value)


# ---------------------------------------------------------------- agent side


@dataclass(slots=True)
class _Call:
    call_id: Any
    model: str
    deadline: float
    bound_s: float
    own_timeout: bool
    future: Future[InferResponse] | None = None


class BlsCalls:
    """The BLS requests of one `execute` call, on the agent side (one executor thread)."""

    def __init__(
        self,
        submit: BlsSubmit | None,
        conn: Connection,
        default_timeout_s: float,
        caller: str,
        traces: Sequence[object | None] = (),
    ) -> None:
        self._submit = submit
        self._traces = traces  # of the execute call's requests: the parents of traced calls
        self._conn = conn
        self._default_s = default_timeout_s
        self._caller = caller
        self._calls: dict[Any, _Call] = {}
        self._wake_r: Connection | None
        self._wake_w: Connection | None
        self._wake_r, self._wake_w = Pipe(duplex=False)
        self._seq = -1
        self._signals: Sequence[CancelSignal] = ()
        self._told: set[int] = set()

    @property
    def busy(self) -> bool:
        return bool(self._calls)

    def watch(self, seq: int, cancelled: Sequence[CancelSignal]) -> None:
        """The cancel signals of the execute's requests (EXECUTE number `seq`): a cancellation
        interrupts `wait`, and `tell_cancelled` passes it on."""
        self._seq, self._signals = seq, cancelled
        for signal in cancelled:
            signal.on_cancel(lambda: _poke(self._wake_w))

    def tell_cancelled(self) -> None:
        """Send the worker a CANCEL for the requests newly cancelled (`is_cancelled()`); once
        every request of the execute is, cancel its BLS calls."""
        new = [i for i, s in enumerate(self._signals) if s.cancelled and i not in self._told]
        if not new:
            return
        self._told.update(new)
        ipc.send(self._conn, ipc.Message(ipc.CANCEL, {"seq": self._seq, "requests": new}))
        if len(self._told) == len(self._signals):
            self.cancel_running()

    def start(self, message: ipc.Message) -> None:
        """Start the BLS request in `message` (or answer its error at once)."""
        meta = message.meta
        call_id = meta.get("id")
        model = str(meta.get("model", ""))
        timeout_us = meta.get("timeout_us") or 0
        own = isinstance(timeout_us, int) and timeout_us > 0
        bound = timeout_us / 1e6 if own else self._default_s
        call = _Call(call_id, model, time.monotonic() + bound, bound, own)
        if len(self._calls) >= MAX_IN_FLIGHT:
            self._answer(call, error=f"more than {MAX_IN_FLIGHT} BLS requests in flight")
            return
        if self._submit is None:
            self._answer(call, error="BLS needs the agent's data plane, which is not running")
            return
        try:
            request = _infer_request(message, timeout_us if own else None, self._parent(meta))
            version = meta.get("version", -1)
            future = self._submit(model, str(version) if int(version) > 0 else None, request)
        except (AgentError, TypeError, ValueError) as exc:
            self._answer(call, error=_message(model, exc))
            return
        call.future = future
        self._calls[call_id] = call
        wake = self._wake_w
        future.add_done_callback(lambda _: _poke(wake))

    def drop(self, message: ipc.Message) -> None:
        """BLS_CANCEL: the model no longer waits for this call; cancel the child request."""
        call = self._calls.pop(message.meta.get("id"), None)
        if call is not None and call.future is not None:
            call.future.cancel()

    def cancel_running(self) -> None:
        """The requests of the execute were all cancelled: so are its BLS calls (each answered
        with Triton's cancellation error, so a model that awaits them goes on)."""
        for call in list(self._calls.values()):
            del self._calls[call.call_id]
            if call.future is not None:
                call.future.cancel()
            self._answer(call, error=CANCELLED)

    def wait(self, deadline: float) -> None:
        """Until the worker sends something, this is woken, a call ends (its result then sent)
        or times out, or `deadline` (a `time.monotonic()` instant) passes."""
        assert self._wake_r is not None
        limit = min([deadline, *(c.deadline for c in self._calls.values())])
        ready = wait([self._conn, self._wake_r], max(0.0, limit - time.monotonic()))
        if self._wake_r in ready:
            while self._wake_r.poll():
                self._wake_r.recv_bytes()
        now = time.monotonic()
        for call in list(self._calls.values()):
            assert call.future is not None
            if call.future.done():
                del self._calls[call.call_id]
                self._finish(call)
            elif now >= call.deadline:
                del self._calls[call.call_id]
                call.future.cancel()
                self._answer(call, error=self._timeout_message(call))

    def cancel(self) -> None:
        """The `execute` ended: calls still running are cancelled, their results dropped."""
        for call in self._calls.values():
            if call.future is not None:
                call.future.cancel()
        self._calls.clear()
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None

    def _parent(self, meta: dict[str, Any]) -> object | None:
        index = meta.get("trace")
        if isinstance(index, int) and 0 <= index < len(self._traces):
            return self._traces[index]
        return None

    def _finish(self, call: _Call) -> None:
        assert call.future is not None
        try:
            response = call.future.result()
        except CancelledError:
            self._answer(call, error=self._timeout_message(call))
            return
        except Exception as exc:  # noqa: BLE001 - any failure is that request's error
            self._answer(call, error=_message(call.model, exc))
            return
        self._answer(call, tensors=[(o.name, o.data) for o in response.outputs])

    def _timeout_message(self, call: _Call) -> str:
        if call.own_timeout:
            return "Request timeout expired"
        return (
            f"BLS request from model '{self._caller}' to model '{call.model}' gave no answer "
            f"within {call.bound_s:g} s (the caller's execute_timeout_seconds); pass a timeout "
            "or add instances if the model calls itself"
        )

    def _answer(
        self,
        call: _Call,
        *,
        error: str | None = None,
        tensors: list[tuple[str, np.ndarray]] | None = None,
    ) -> None:
        meta: dict[str, Any] = {"id": call.call_id}
        if error is not None:
            meta["error"] = error
        ipc.send(self._conn, ipc.Message(ipc.BLS_RESULT, meta, tensors or []))


def _poke(wake: Connection | None) -> None:
    if wake is not None:
        with contextlib.suppress(OSError):
            wake.send_bytes(b"")


def _infer_request(
    message: ipc.Message, timeout_us: int | None, parent_trace: object | None = None
) -> InferRequest:
    import json  # noqa: PLC0415

    meta = message.meta
    inputs = tuple(
        InferInput(name, pb_utils.numpy_to_kserve(array.dtype), tuple(array.shape), array)
        for name, array in message.tensors
    )
    names = [str(n) for n in meta.get("outputs") or []]
    outputs = tuple(RequestedOutput(n) for n in names) if names else None
    parameters = json.loads(str(meta.get("parameters") or "{}"))
    if not isinstance(parameters, dict):
        raise ValueError("parameters must be an object")
    if timeout_us is not None:
        parameters["timeout"] = timeout_us
    request_id = str(meta.get("request_id") or "") or None
    return InferRequest(
        inputs, id=request_id, outputs=outputs, parameters=parameters, parent_trace=parent_trace
    )


def _message(model: str, exc: BaseException) -> str:
    if isinstance(exc, ModelNotFoundError | ModelNotReadyError):
        return (
            f"Failed for execute the inference request. Model '{model}' is not ready. {exc.message}"
        )
    if isinstance(exc, RequestTimeoutError):
        return "Request timeout expired"
    if isinstance(exc, AgentError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
