"""The HTTP error table: every `AgentError` type to its status code, and the one JSON body of an
error answer, for both front doors (the aiohttp middleware, `agent.api.http.middleware`, and the
infer lane, `agent.api.http.lane`), so a client reads the same status and bytes from either.

The codes are Triton's for the same situation (its HttpCodeFromError: INVALID_ARG 400,
NOT_FOUND 404, INTERNAL 500, UNAVAILABLE 503), read through `agent.errors.lookup` (a type gets
the row of its nearest listed base; a test checks that every type is listed).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from agent.api.access import RestrictedApiError
from agent.api.http.limits import ClientTimeoutError, StoppingError, must_close
from agent.api.model_load import ModelLoadFailedError
from agent.api.tls import TlsError
from agent.errors import (
    AccessDeniedError,
    AgentError,
    BackendError,
    CacheCommitError,
    ConflictError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    MemoryPressureError,
    ModelConfigError,
    ModelControlDisabledError,
    ModelControlError,
    ModelInstanceFailedError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelReportedCancelledError,
    ModelReportedError,
    ModelReportedExistsError,
    ModelReportedInvalidArgError,
    ModelReportedNotFoundError,
    ModelReportedUnavailableError,
    ModelReportedUnknownError,
    ModelReportedUnsupportedError,
    NoReadyVersionError,
    OverloadedError,
    PayloadTooLargeError,
    RegionExistsError,
    RepositoryPollError,
    RequestTimeoutError,
    SharedMemoryNotFoundError,
    UnknownTensorError,
    UnsupportedError,
    lookup,
)
from agent.serving.dataplane import DataPlane

__all__ = ["STATUS_FOR_ERROR", "error_answer", "error_body", "error_response", "status_for"]

logger = logging.getLogger(__name__)

# The one place where error types become HTTP status codes (every type listed: a test checks).
STATUS_FOR_ERROR: dict[type[AgentError], int] = {
    InvalidInputError: 400,
    UnknownTensorError: 400,
    ModelControlError: 400,
    ModelConfigError: 400,
    AccessDeniedError: 403,
    RestrictedApiError: 403,  # Triton's answer to a restricted API
    ModelLoadFailedError: 400,
    ModelNotFoundError: 404,
    NoReadyVersionError: 404,
    SharedMemoryNotFoundError: 404,
    ConflictError: 409,
    RegionExistsError: 400,
    ClientTimeoutError: 408,
    PayloadTooLargeError: 413,
    BackendError: 500,
    ModelInstanceFailedError: 500,
    ModelReportedError: 500,  # a model's TritonError: Triton's status for its code
    ModelReportedUnknownError: 400,  # Triton's HTTP status for UNKNOWN, ALREADY_EXISTS, CANCELLED
    ModelReportedNotFoundError: 404,
    ModelReportedInvalidArgError: 400,
    ModelReportedUnavailableError: 503,
    ModelReportedUnsupportedError: 501,
    ModelReportedExistsError: 400,
    ModelReportedCancelledError: 400,
    CacheCommitError: 500,
    ModelLoadError: 500,
    RepositoryPollError: 500,
    MemoryBudgetError: 500,
    InternalError: 500,
    UnsupportedError: 501,
    TlsError: 500,
    AgentError: 500,
    ModelNotReadyError: 503,
    ModelControlDisabledError: 503,
    OverloadedError: 503,
    MemoryPressureError: 503,
    StoppingError: 503,
    RequestTimeoutError: 503,
}


def status_for(error: BaseException) -> int:
    """The HTTP status for an error (any non-`AgentError` is an `InternalError`: 500)."""
    return lookup(STATUS_FOR_ERROR, error)


def error_answer(
    dataplane: DataPlane, error: BaseException, where: str = "POST /infer"
) -> tuple[int, str, bool]:
    """The answer to an error from a request (`where`: its method and path, for the log): the
    status, the message with no path of the device, and whether the connection must close (the
    rest of the body is never read). Anything but an `AgentError` is a bug: logged with its
    traceback and answered 500."""
    if not isinstance(error, AgentError):
        logger.error("%s failed", where, exc_info=error)
    message = dataplane.scrub(InternalError.wrap(error).message)
    return status_for(error), message, must_close(error)


def error_body(message: str) -> bytes:
    """Triton's `{"error": "..."}` body, byte for byte the same from either front door."""
    return json.dumps({"error": message}).encode()


def error_response(status: int, message: str) -> web.Response:
    """An error answer as aiohttp sends it (the lane writes the same status line and body)."""
    return web.Response(
        body=error_body(message), status=status, content_type="application/json", charset="utf-8"
    )
