"""The agent's error tree, and the one lookup every transport maps it through.

Every error the data plane raises is an `AgentError`. Each transport (HTTP, gRPC, MQTT) maps these
types to its own codes in one table (`agent.api.http.errors.STATUS_FOR_ERROR`,
`agent.api.grpc.service.STATUS_FOR_ERROR`, `agent.fleet.executor.ERROR_CODES`), read through
`lookup`; no transport code lives here. An exception that is not an `AgentError` is a bug: the
transports answer it as `InternalError` (HTTP 500, gRPC INTERNAL, MQTT `internal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Code = TypeVar("Code")


class AgentError(Exception):
    """Base of every error the agent reports to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # Set by a scheduler where the model ran and answered the request with this error (a
        # Python model's error response): the execution's queue, compute input, infer and
        # output ns. Triton counts such a request a success in the statistics.
        self.answered: tuple[int, int, int, int] | None = None


class InvalidInputError(AgentError):
    """The request is malformed or does not match the model (shape, dtype, names, sizes)."""


class UnknownTensorError(InvalidInputError):
    """The request names an input or output the model does not have. Triton words it without
    the request's id (it refuses the name before it reads the request's inputs)."""


class ModelNotFoundError(AgentError):
    """No such model, or no such version of it, in the repository."""


class ModelNotReadyError(AgentError):
    """The model or version exists but is not loaded and ready to serve."""


class NoReadyVersionError(ModelNotReadyError):
    """A request names a known model without a version, and no version of it is READY.

    Still "not ready" for the agent's own callers; Triton answers this case NOT_FOUND ("has no
    available versions"), so the transports do too.
    """


class SharedMemoryNotFoundError(AgentError):
    """A request names a shared-memory region that is not registered."""


class AccessDeniedError(AgentError):
    """The client may not do this (a remote client registering shared memory, an object of
    another user)."""


class OverloadedError(AgentError):
    """The agent cannot accept more work right now (queue full); the client may retry."""


class MemoryPressureError(OverloadedError):
    """Taking this request now would take the agent past its memory budget (HTTP 503, gRPC
    RESOURCE_EXHAUSTED); the client may retry once others are served."""


class RequestTimeoutError(AgentError):
    """The request's queue timeout expired before it ran (timeout_action REJECT)."""


class PayloadTooLargeError(AgentError):
    """The request body is over the configured limit."""


class BackendError(AgentError):
    """The inference backend failed while running a request that passed validation."""


class ModelReportedError(BackendError):
    """A model failed a request with one of Triton's error codes (`pb_utils.TritonError(message,
    code)`, returned in its response or raised). The message is the model's own; the subclass
    is the code, and each transport answers with Triton's status for it (INTERNAL: this class)."""


class ModelReportedUnknownError(ModelReportedError):
    """TritonError.UNKNOWN (HTTP 400, gRPC UNKNOWN)."""


class ModelReportedNotFoundError(ModelReportedError):
    """TritonError.NOT_FOUND (HTTP 404, gRPC NOT_FOUND)."""


class ModelReportedInvalidArgError(ModelReportedError):
    """TritonError.INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT)."""


class ModelReportedUnavailableError(ModelReportedError):
    """TritonError.UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE)."""


class ModelReportedUnsupportedError(ModelReportedError):
    """TritonError.UNSUPPORTED (HTTP 501, gRPC UNIMPLEMENTED)."""


class ModelReportedExistsError(ModelReportedError):
    """TritonError.ALREADY_EXISTS (HTTP 400, gRPC ALREADY_EXISTS)."""


class ModelReportedCancelledError(ModelReportedError):
    """TritonError.CANCELLED (HTTP 400, gRPC CANCELLED)."""


class ModelInstanceFailedError(BackendError):
    """A model instance failed while it ran the request (its worker hung and was killed, or
    died). A backend that restarts its instances (`ReportsHealth`) serves on with the others;
    for any other the data plane takes the version out of service with the message as reason.
    """


class ModelConfigError(AgentError):
    """A model's config.pbtxt is invalid or contradicts the model file."""


class ModelLoadError(AgentError):
    """A model version could not be loaded (missing file, runtime refused it, warm-up failed)."""


class CacheCommitError(ModelLoadError):
    """The model cache could not record an activation (I/O, a corrupt blob): the version loaded,
    so this is not the version's fault and does not reject it."""


class MemoryBudgetError(ModelLoadError):
    """A model version does not fit in what is left of the memory budget."""


class RepositoryPollError(ModelLoadError):
    """A load request's model could not be read into a model folder (its config override does
    not parse, its files cannot be written): Triton's "failed to poll from model repository"."""


class ConflictError(AgentError):
    """The request conflicts with what is in progress (e.g. a canary already runs)."""


class RegionExistsError(ConflictError):
    """A shared-memory region of that name is registered already.

    Triton's ALREADY_EXISTS, which its HTTP endpoint answers 400 (not 409).
    """


class ModelControlError(AgentError):
    """A model-control request is not allowed in the current mode (e.g. load without explicit)."""


class ModelControlDisabledError(ModelControlError):
    """Explicit load / unload while the model-control mode is not explicit (Triton: UNAVAILABLE)."""


class UnsupportedError(AgentError):
    """The model cannot serve the request this way (Triton's UNSUPPORTED: e.g. a plain infer
    call to a decoupled model)."""


class InternalError(AgentError):
    """An unexpected exception (a bug) while handling a request; the message names it."""

    @classmethod
    def wrap(cls, exc: BaseException) -> AgentError:
        """`exc` itself when it is an `AgentError`, else an `InternalError` naming it."""
        if isinstance(exc, AgentError):
            return exc
        return cls(f"internal error: {type(exc).__name__}: {exc}")


class AgentConfigError(Exception):
    """The agent's own configuration (TOML file or flags) is invalid; start-up stops."""


def lookup(table: Mapping[type[AgentError], Code], error: BaseException) -> Code:
    """A transport's code for an error: the row of its class or of its nearest listed base.

    An exception that is not an `AgentError` is looked up as `InternalError`. Every table maps
    `AgentError` itself, so the walk always ends on a row; a test checks that each table also
    maps every subclass explicitly.

    Raises:
        KeyError: the table maps neither the error's class nor any of its bases.
    """
    kind = type(error) if isinstance(error, AgentError) else InternalError
    for cls in kind.__mro__:
        if issubclass(cls, AgentError) and cls in table:
            return table[cls]
    raise KeyError(f"no code for {kind.__name__} in the table")
