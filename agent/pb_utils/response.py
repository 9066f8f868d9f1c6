"""Triton's `pb_utils.InferenceResponse` and the response sender of decoupled models.

Re-exported by `agent.pb_utils`; needs only the standard library.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.pb_utils.errors import ModelError, TritonModelException
from agent.pb_utils.tensor import Tensor

# Response flags (Triton's TRITONSERVER_ResponseCompleteFlag).
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model (`get_response_sender()`).

    The transport (set by the worker) gets each checked response with its final flag; the
    checks and their wording are Triton's Python backend's.
    """

    def __init__(
        self,
        transport: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
        *,
        decoupled: bool = True,
    ) -> None:
        self._transport = transport
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send a response, and/or with TRITONSERVER_RESPONSE_COMPLETE_FINAL end the request.

        Raises:
            TritonModelException: a bad flag, no response without the final flag, or the
                sender was closed by an earlier final flag.
        """
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Unable to send response. Expected an InferenceResponse, got "
                f"{type(response).__name__}."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled and response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if not self._decoupled and response is None and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if final:
                self._closed = True
            self._sent += 1
            self._transport(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def is_closed(self) -> bool:
        with self._lock:
            return self._closed


class InferenceResponse:
    """The answer to one request: output tensors, or an error; `parameters` (a dict of bool,
    int or str values, or that dict as a JSON string) come back in the response's parameters.

    Raises:
        TritonModelException: parameters of another kind (Triton's words).
    """

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: ModelError | None = None,
        parameters: Mapping[str, bool | int | str] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors) if output_tensors else []
        self._error = error
        self._parameters = {} if parameters is None else _checked_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> ModelError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON string (as Triton returns them)."""
        return json.dumps(self._parameters)


def parameters_of(response: InferenceResponse) -> dict[str, bool | int | str]:
    """The response's parameters as `parameters()` would give them back from JSON (the worker
    reads them for every response: no JSON round trip; checked bool/int/str when set)."""
    return dict(response._parameters)


def _checked_parameters(
    parameters: Mapping[str, bool | int | str] | str | None,
) -> dict[str, bool | int | str]:
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise TritonModelException(f"parameters must be a JSON object: {exc}") from None
    if not isinstance(parameters, Mapping):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    return checked_parameter_types(parameters)


def checked_parameter_types(parameters: Mapping[Any, Any]) -> dict[str, bool | int | str]:
    """A copy of `parameters` if every key is a str and every value a bool, int or str (what
    Triton's requests and responses carry).

    Raises:
        TritonModelException: another key or value type, in Triton's words.
    """
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called `name`, or None."""
    return next((t for t in response.output_tensors() if t.name() == name), None)
