"""A Python model's failures in Triton's words and codes.

A model fails a request in two ways, both Triton's: it returns `InferenceResponse(error=
TritonError(message, code))`, answered with the message alone and Triton's status for the code;
or `execute` raises, answered "Failed to process the request(s) for model '<instance name>',
message: <Type>: <message>" with the model's frames (a raised TritonError keeps its code). The
instance name is Triton's: `<group name>_<index>`, where an unnamed group of a config is named
`<model>_<group index>` (so 'm_0_0') and the group auto-completion adds is named `<model>` ('m_0').
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.errors import (
    BackendError,
    ModelReportedCancelledError,
    ModelReportedError,
    ModelReportedExistsError,
    ModelReportedInvalidArgError,
    ModelReportedNotFoundError,
    ModelReportedUnavailableError,
    ModelReportedUnknownError,
    ModelReportedUnsupportedError,
)

__all__ = ["raised_error", "reported_error"]

# pb_utils.TritonError's codes (UNKNOWN = 0 ... CANCELLED = 7); INTERNAL (1) is the base class.
_BY_CODE: dict[int, type[ModelReportedError]] = {
    0: ModelReportedUnknownError,
    1: ModelReportedError,
    2: ModelReportedNotFoundError,
    3: ModelReportedInvalidArgError,
    4: ModelReportedUnavailableError,
    5: ModelReportedUnsupportedError,
    6: ModelReportedExistsError,
    7: ModelReportedCancelledError,
}


def reported_error(message: str, code: object) -> ModelReportedError:
    """The error for a model's TritonError(message, code); an unknown code is INTERNAL."""
    kind = _BY_CODE.get(code, ModelReportedError) if isinstance(code, int) else ModelReportedError
    return kind(message)


def raised_error(instance: str, meta: Mapping[str, object]) -> BackendError:
    """The error for an exception `execute` raised in the instance named `instance` (the
    worker's ERROR meta: "message", and "code" when it was a TritonError)."""
    text = (
        f"Failed to process the request(s) for model '{instance}', "
        f"message: {meta.get('message', '')}"
    )
    if "code" in meta:
        return reported_error(text, meta["code"])
    return BackendError(text)
