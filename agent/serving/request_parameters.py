"""What every inference reads off a request, whichever path serves it (one response or a
stream): Triton's scheduling parameters, what the model itself may read (its context), and the
wall clock the statistics record."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agent.errors import InvalidInputError
from agent.scheduling.sequence_policy import SequenceRequest
from agent.tensors.request import InferRequest, RequestContext

# Parameters the server consumes itself: a model does not see them (`request.parameters()`).
_CONSUMED = frozenset(
    (
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
    )
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def scheduling_parameters(params: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The request parameters `priority` and `timeout` (microseconds), as Triton reads them."""
    priority = params.get("priority")
    timeout = params.get("timeout")
    for label, value in (("priority", priority), ("timeout", timeout)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise InvalidInputError(f"parameter '{label}' must be a non-negative integer")
    return priority, timeout


def request_context(request: InferRequest, correlation_id: int | str = 0) -> RequestContext | None:
    """The request's id, its parameters a model may read and its sequence's correlation id;
    None when it has none of them (the model then reads Triton's defaults: "", {}, 0)."""
    params = {k: v for k, v in request.parameters.items() if k not in _CONSUMED}
    if not request.id and not params and not correlation_id:
        return None
    return RequestContext(request.id or "", params, correlation_id)


def ensemble_parameters(sequence: SequenceRequest | None) -> dict[str, Any]:
    """The parameters Triton answers every ensemble response with: the request's sequence id
    and flags (0 and false outside a sequence)."""
    if sequence is None:
        return {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    return {
        "sequence_id": sequence.correlation_id,
        "sequence_start": sequence.start,
        "sequence_end": sequence.end,
    }
