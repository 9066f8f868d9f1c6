"""The agent's error tree.

Every error the data plane raises is an `AgentError`; transports (HTTP today, gRPC and MQTT later)
map the leaf types to their own status codes in one table each, so no transport code lives here.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent reports to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInputError(AgentError):
    """The request is malformed or does not match the model (shape, dtype, names, sizes)."""


class ModelNotFoundError(AgentError):
    """No such model, or no such version of it, in the repository."""


class ModelNotReadyError(AgentError):
    """The model or version exists but is not loaded and ready to serve."""


class SharedMemoryNotFoundError(AgentError):
    """A request names a shared-memory region that is not registered."""


class OverloadedError(AgentError):
    """The agent cannot accept more work right now (queue full); the client may retry."""


class RequestTimeoutError(AgentError):
    """The request's queue timeout expired before it ran (timeout_action REJECT)."""


class PayloadTooLargeError(AgentError):
    """The request body is over the configured limit."""


class BackendError(AgentError):
    """The inference backend failed while running a request that passed validation."""


class ModelInstanceFailedError(BackendError):
    """A model instance can no longer serve (its worker hung and was killed, or died).

    The data plane takes the version out of service with the message as its reason.
    """


class ModelConfigError(AgentError):
    """A model's config.pbtxt is invalid or contradicts the model file."""


class ModelLoadError(AgentError):
    """A model version could not be loaded (missing file, runtime refused it, warm-up failed)."""


class MemoryBudgetError(ModelLoadError):
    """A model version does not fit in what is left of the memory budget."""


class ConflictError(AgentError):
    """The request conflicts with what is in progress (e.g. a canary already runs)."""


class ModelControlError(AgentError):
    """A model-control request is not allowed in the current mode (e.g. load without explicit)."""


class AgentConfigError(Exception):
    """The agent's own configuration (TOML file or flags) is invalid; start-up stops."""
