"""Triton's `pb_utils.InferenceRequest`: as `execute` receives it, or built by the model for BLS.

Re-exported by `agent.pb_utils`; needs only the standard library (asyncio for `async_exec`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from agent.pb_utils.errors import TritonModelException
from agent.pb_utils.response import InferenceResponseSender, checked_parameter_types
from agent.pb_utils.tensor import Tensor

# Request flags (Triton's TRITONSERVER_RequestFlag): a BLS request's `flags=`, with its
# `correlation_id=`, make it a request of that sequence.
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class InferenceTrace:
    """A request's trace, as `request.trace()` returns it inside `execute`.

    Pass it to a BLS request (`InferenceRequest(..., trace=request.trace())`) to have that
    request traced as a child of this one when this one is traced (Triton's tracing for BLS).
    """

    def __init__(self, index: int | None = None) -> None:
        self.index = index  # which request of the execute call; None: not traced

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The OpenTelemetry context Triton would hand over; this agent keeps it agent-side."""
        return None


class InferenceRequest:
    """A request: as `execute` receives it, or built by the model for BLS and run with `exec`.

    For BLS (Triton's business logic scripting), inside `execute`::

        request = pb_utils.InferenceRequest(
            model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[tensor, ...],
            model_version=-1, timeout=0, parameters={"key": "value"})
        response = request.exec()             # or: await request.async_exec()

    `model_version` -1 is the version the model's policy serves (a canary may route it);
    `timeout` is in microseconds (0: none); `parameters` values are bool, int or str. The call
    runs through the agent's own data plane; a failure (an unknown model included) comes back
    as a response whose `error()` says why.
    """

    # The response sender of a request `execute` receives, or what makes it on first use.
    _sender: InferenceResponseSender | None = None
    _make_sender: Callable[[InferenceRequest], InferenceResponseSender] | None = None

    def __init__(
        self,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        request_id: str = "",
        *,
        model_name: str | bytes = "",
        model_version: int = -1,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = [str(n) for n in requested_output_names]
        self._id = request_id
        # Triton models often pass a BYTES element (`as_numpy()[0]`) as the model name.
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = int(model_version)
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        self._flags = int(flags)
        if int(timeout) < 0:
            raise TritonModelException("timeout must be a non-negative number of microseconds")
        self._timeout = int(timeout)
        self._cancelled = False
        self._parameters: dict[str, Any] = checked_parameter_types(parameters or {})
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def get_response_sender(self) -> InferenceResponseSender:
        """This request's response sender (decoupled models).

        A model that is not decoupled may answer through it too (one response, inside
        `execute`, which then returns None), as Triton allows.

        Raises:
            TritonModelException: the request was built by the model (BLS).
        """
        sender = self._sender
        if sender is None:
            if self._make_sender is None:
                raise TritonModelException(
                    "get_response_sender() is only available on the requests `execute` receives"
                )
            sender = self._sender = self._make_sender(self)
        return sender

    def set_response_sender(self, sender: InferenceResponseSender) -> None:
        """Attach the sender (the worker does this for decoupled models; not Triton's API)."""
        self._sender = sender

    def set_response_sender_factory(
        self, make: Callable[[InferenceRequest], InferenceResponseSender]
    ) -> None:
        """Have `make(request)` build the sender when the model first asks for it (the worker
        does this for models that are not decoupled: most never ask; not Triton's API)."""
        self._make_sender = make

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._id

    def trace(self) -> InferenceTrace:
        """This request's trace: pass it as `trace=` to a BLS request to trace that as a child."""
        return self._trace

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The parameters as a JSON string (as Triton returns them)."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled: its client went away, or the BLS call that made
        it was cancelled (as Triton's; a model may stop early and answer an error response)."""
        return self._cancelled

    def set_cancelled(self) -> None:
        """Mark the request cancelled (the worker does, when the agent says so)."""
        self._cancelled = True

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` and wait for its response (BLS).

        `decoupled=True` (needed for a decoupled model, allowed for any): an iterator of its
        responses, the last one with the final flag (an empty response when the model sent
        the flag alone); it is returned once the first response came.

        Raises:
            TritonModelException: called outside `execute` (of a model that is not decoupled).
        """
        return self._submit(decoupled).result()

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Run this request on `model_name`: `await request.async_exec()` (BLS).

        `decoupled=True`: the awaitable gives the responses' iterator (`for` or `async for`).
        Cancelling the awaiting task (`task.cancel()`, `asyncio.wait_for` timing out) cancels
        the child request in the agent too. Must be called from the running event loop of an
        `async def execute`.

        Raises:
            TritonModelException: called outside `execute` (of a model that is not decoupled).
        """
        import asyncio  # noqa: PLC0415 - only models with async execute need it

        return asyncio.wrap_future(self._submit(decoupled))

    def _submit(self, decoupled: bool) -> Future[Any]:
        if _bls_runner is None:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        return _bls_runner(self, bool(decoupled))


# Starts a BLS request (decoupled or not), its response (or iterator) to come in the future:
# set by the worker while `execute` runs (for a decoupled model: from then on), None otherwise.
BlsRunner = Callable[[InferenceRequest, bool], "Future[Any]"]
_bls_runner: BlsRunner | None = None


def set_bls_runner(runner: BlsRunner | None) -> None:
    """Let `InferenceRequest.exec` run requests (the worker sets it around `execute`)."""
    global _bls_runner  # noqa: PLW0603 - one model per worker process
    _bls_runner = runner


_UNTRACED = InferenceTrace()


def received_request(
    inputs: list[Tensor],
    requested_output_names: list[str],
    described: Mapping[str, Any],
    trace: InferenceTrace | None = None,
) -> InferenceRequest:
    """A request as `execute` receives it (the worker builds it from the agent's description:
    "request_id", "parameters", "correlation_id", each optional); `inputs` and
    `requested_output_names` become the request's own lists. Its parameters are the client's as
    sent, not held to the types a BLS request may carry."""
    # Every field __init__ sets, without the checks a model's own BLS request needs: this runs
    # for every request of every call.
    request = InferenceRequest.__new__(InferenceRequest)
    request._inputs = inputs
    request._outputs = requested_output_names
    request._id = str(described.get("request_id") or "")
    request._model_name = ""
    request._model_version = -1
    correlation = described.get("correlation_id", 0)
    request._correlation_id = correlation if isinstance(correlation, int | str) else 0
    request._flags = 0
    request._timeout = 0
    request._cancelled = False
    params = described.get("parameters")
    request._parameters = dict(params) if isinstance(params, dict) else {}
    request._trace = _UNTRACED if trace is None else trace
    return request


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called `name`, or None."""
    for tensor in request._inputs:
        if tensor.name() == name:
            return tensor
    return None
