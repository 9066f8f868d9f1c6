"""BLS (Triton's business logic scripting): a Python model runs other models from `execute`.

Worker side (`agent.backends.python.worker.bls_client`): `exec` / `async_exec` send a BLS
message and wait for its BLS_RESULT (several for `decoupled=True`, the last one "final").

Agent side: while the backend waits for the answer to EXECUTE, `BlsCalls` starts each BLS
request it receives through the injected `BlsRunner` (the data plane's `infer` on the agent's
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

A decoupled model's BLS requests are served at any time instead (`python_bls_relay`).
With `decoupled=True` each response of the called model goes back as it comes.

Limits: at most `MAX_IN_FLIGHT` calls per `execute` at once; tensors are bounded as every
message on the wire (`python_ipc`).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agent import pb_utils
from agent.backends.cancellation import CancelSignal
from agent.backends.python import ipc
from agent.backends.python.wakeup import Wakeup
from agent.errors import (
    AgentError,
    ModelNotFoundError,
    ModelNotReadyError,
    RequestTimeoutError,
)
from agent.tensors.request import InferInput, InferRequest, InferResponse, RequestedOutput

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
CANCELLED = ipc.CANCELLED

# Gets each response of a streamed request: its outputs, or its error; the final flag.
OnStreamItem = Callable[[InferResponse | None, AgentError | None, bool], None]


class BlsRunner(Protocol):
    """Runs BLS requests on (model, version or None) from any thread (the data plane)."""

    def submit_threadsafe(
        self, model: str, version: str | None, request: InferRequest, *, refusal: str | None = None
    ) -> Future[InferResponse]:
        """One response; `refusal` words the error when the model is decoupled."""
        ...

    def stream_threadsafe(
        self, model: str, version: str | None, request: InferRequest, on_item: OnStreamItem
    ) -> Future[None]:
        """Every response (`decoupled=True`), to `on_item`; the future ends with the stream."""
        ...


def decoupled_refusal(model: str) -> str:
    """Triton's error for a BLS call without `decoupled=True` to a decoupled model."""
    return (
        f"Model {model} is using the decoupled. The current BLS request call doesn't support "
        "models using the decoupled transaction policy. Please use 'decoupled=True' argument to "
        "the 'exec' or 'async_exec' calls for decoupled models.'"
    )


def start_child(
    runner: BlsRunner,
    model: str,
    meta: dict[str, Any],
    request: InferRequest,
    on_item: OnStreamItem | None,
) -> Future[Any]:
    """Start a BLS child request on the version `meta` names (<= 0: the policy's choice).

    With `on_item` it is streamed (`decoupled=True`); without, one response is awaited and a
    decoupled model refuses it with Triton's wording.
    """
    version = meta.get("version", -1)
    number = str(version) if int(version) > 0 else None
    if on_item is not None:
        return runner.stream_threadsafe(model, number, request, on_item)
    return runner.submit_threadsafe(model, number, request, refusal=decoupled_refusal(model))


# ---------------------------------------------------------------- agent side


@dataclass(slots=True)
class _Call:
    call_id: Any
    model: str
    deadline: float
    bound_s: float
    own_timeout: bool
    future: Future[Any] | None = None
    # A streamed call (`decoupled=True`): its responses as they come, until one is final.
    items: queue.SimpleQueue[tuple[InferResponse | None, AgentError | None, bool]] | None = None
    ended: bool = field(default=False)


class BlsCalls:
    """The BLS requests of one `execute` call, on the agent side (one executor thread)."""

    def __init__(
        self,
        submit: BlsRunner | None,
        wakeup: Wakeup,
        send: Callable[[ipc.Message], None],
        default_timeout_s: float,
        caller: str,
        traces: Sequence[object | None] = (),
    ) -> None:
        """`wakeup`: the worker's (waits on its pipe); `send`: the worker's send (its one
        lock)."""
        self._submit = submit
        self._traces = traces  # of the execute call's requests: the parents of traced calls
        self._wakeup = wakeup
        self._send = send
        self._default_s = default_timeout_s
        self._caller = caller
        self._calls: dict[Any, _Call] = {}
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
            signal.on_cancel(self._wakeup.poke)

    def tell_cancelled(self) -> None:
        """Send the worker a CANCEL for the requests newly cancelled (`is_cancelled()`); once
        every request of the execute is, cancel its BLS calls."""
        new = [i for i, s in enumerate(self._signals) if s.cancelled and i not in self._told]
        if not new:
            return
        self._told.update(new)
        self._send(ipc.Message(ipc.CANCEL, {"seq": self._seq, "requests": new}))
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
        wake = self._wakeup.poke
        try:
            request = infer_request_of(message, timeout_us if own else None, self._parent(meta))
            on_item: OnStreamItem | None = None
            if meta.get("decoupled"):
                items: queue.SimpleQueue[tuple[InferResponse | None, AgentError | None, bool]]
                items = call.items = queue.SimpleQueue()

                def on_item(
                    response: InferResponse | None, error: AgentError | None, final: bool
                ) -> None:
                    items.put((response, error, final))
                    wake()

            future = start_child(self._submit, model, meta, request, on_item)
        except (AgentError, TypeError, ValueError) as exc:
            self._answer(call, error=failure_text(model, exc), final=bool(meta.get("decoupled")))
            return
        call.future = future
        self._calls[call_id] = call
        future.add_done_callback(lambda _: wake())

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
            self._answer(call, error=CANCELLED, final=True)

    def wait(self, deadline: float) -> bool:
        """Until the worker sends something, this is woken, a call ends (its result then sent)
        or times out, or `deadline` (a `time.monotonic()` instant) passes. True when the
        worker's pipe is readable."""
        limit = deadline
        for call in self._calls.values():
            limit = min(limit, call.deadline)
        readable = self._wakeup.wait(limit - time.monotonic())
        if not self._calls:
            return readable
        now = time.monotonic()
        for call in list(self._calls.values()):
            assert call.future is not None
            done = call.future.done()  # before the responses: all of a done stream are queued
            if call.items is not None:
                self._pass_on(call, now)
            if call.ended:
                del self._calls[call.call_id]
            elif done:
                del self._calls[call.call_id]
                self._finish(call)
            elif now >= call.deadline:
                del self._calls[call.call_id]
                call.future.cancel()
                self._answer(call, error=self._timeout_message(call), final=True)
        return readable

    def _pass_on(self, call: _Call, now: float) -> None:
        """Send a streamed call's responses that came (each restarts its clock, unless the
        call has a timeout of its own: that bounds the whole request)."""
        assert call.items is not None
        while not call.ended:
            try:
                response, error, final = call.items.get_nowait()
            except queue.Empty:
                return
            if not call.own_timeout:
                call.deadline = now + call.bound_s
            call.ended = final
            if error is not None:
                self._answer(call, error=failure_text(call.model, error), final=final)
            elif response is not None:
                tensors = [(o.name, o.data) for o in response.outputs]
                self._answer(call, tensors=tensors, final=final)
            else:
                self._answer(call, final=final)

    def cancel(self) -> None:
        """The `execute` ended: calls still running are cancelled, their results dropped."""
        for call in self._calls.values():
            if call.future is not None:
                call.future.cancel()
        self._calls.clear()

    def _parent(self, meta: dict[str, Any]) -> object | None:
        index = meta.get("trace")
        if isinstance(index, int) and 0 <= index < len(self._traces):
            return self._traces[index]
        return None

    def _finish(self, call: _Call) -> None:
        assert call.future is not None
        streamed = call.items is not None
        try:
            response = call.future.result()
        except CancelledError:
            self._answer(call, error=self._timeout_message(call), final=streamed)
            return
        except Exception as exc:  # noqa: BLE001 - any failure is that request's error
            self._answer(call, error=failure_text(call.model, exc), final=streamed)
            return
        if streamed:  # the stream ended without a final response (the data plane ends it)
            self._answer(call, final=True)
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
        final: bool | None = None,
    ) -> None:
        meta: dict[str, Any] = {"id": call.call_id}
        if error is not None:
            meta["error"] = error
        if final is not None:  # a streamed call's response
            meta["final"] = final
        self._send(ipc.Message(ipc.BLS_RESULT, meta, tensors or []))


def infer_request_of(
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
    parameters.update(_sequence(meta.get("correlation_id"), meta.get("flags")))
    request_id = str(meta.get("request_id") or "") or None
    return InferRequest(
        inputs, id=request_id, outputs=outputs, parameters=parameters, parent_trace=parent_trace
    )


def _sequence(correlation_id: object, flags: object) -> dict[str, Any]:
    """A BLS request's `correlation_id` and `flags` as the sequence parameters a client sends
    (Triton passes them on as the request's own: the called model's sequence batcher uses them)."""
    found: dict[str, Any] = {}
    if isinstance(correlation_id, int | str) and correlation_id not in (0, ""):
        found["sequence_id"] = correlation_id
    bits = flags if isinstance(flags, int) else 0
    if bits & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        found["sequence_start"] = True
    if bits & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        found["sequence_end"] = True
    return found


def failure_text(model: str, exc: BaseException) -> str:
    if isinstance(exc, ModelNotFoundError | ModelNotReadyError):  # Triton's words, then ours
        return (
            f"Model {model} - Error when running inference: Failed for execute the inference "
            f"request. Model '{model}' is not ready. {exc.message}"
        )
    if isinstance(exc, RequestTimeoutError):
        return "Request timeout expired"
    if isinstance(exc, AgentError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
