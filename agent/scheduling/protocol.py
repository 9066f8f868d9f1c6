"""What the data plane and model control use of a model version's scheduler: one `Scheduler`
protocol with one `submit`, implemented by the dynamic batcher (`ModelScheduler`), the sequence
batcher (`SequenceScheduler`) and an ensemble's runner (`agent.ensemble.runner`).

Every scheduler takes every request parameter; one that has no use for a parameter ignores it,
as Triton does: a stateless model ignores the sequence flags, the sequence batcher has no
priority levels, an ensemble hands both on to its steps. So the caller never asks which kind it
holds.

The one thing a caller does ask is declared, not probed: `sequences` is the scheduler's record of
the live sequences it keeps from START to END (the sequence batcher itself), None for the others.
The data plane reads it per request to keep a live sequence on the version it started on
(`agent.serving.sequence_routes`), so it is a typed member rather than a runtime-checkable
`isinstance` (which costs microseconds on every call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent.backends.base import ResponseSink
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.sequence_policy import CorrelationId, SequenceRequest
from agent.tensors.signature import ValidatedRequest

__all__ = ["ExecutionResult", "KeepsSequences", "Scheduler"]


@dataclass(slots=True)  # not frozen: its __init__ would set each field through object.__setattr__
class ExecutionResult:
    """One request's outputs and where its time went (read-only by convention: one is made per
    request, and a frozen one costs ~0.5 µs more to make).

    `names`: the outputs' names, when a backend answered by name (a Python model: the requested
    outputs it returned, in its order); None: `outputs` holds every requested output, in the
    request's order.
    """

    outputs: list[np.ndarray]
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    batch_size: int
    names: tuple[str, ...] | None = None
    # The response parameters the model set (a Python model's `InferenceResponse(parameters=)`).
    parameters: Mapping[str, Any] | None = None

    def named(self, requested: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
        """Each output with its name; `requested`: the request's output names, in its order."""
        return zip(requested if self.names is None else self.names, self.outputs, strict=True)


class KeepsSequences(Protocol):
    """The live sequences a scheduler keeps: each stays on it from its START to its END."""

    def owns(self, corrid: CorrelationId) -> bool:
        """Whether a sequence with this id is live or waiting for a slot here."""
        ...


class Scheduler(Protocol):
    """Queues and runs the requests of one loaded model version."""

    @property
    def model(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def policy(self) -> BatchingPolicy:
        """The batching parameters in force (the request-size limits, for every scheduler)."""
        ...

    @property
    def pending(self) -> int:
        """Requests queued or executing (a drain waits until none are)."""
        ...

    @property
    def sequences(self) -> KeepsSequences | None:
        """The live sequences it keeps (the sequence batcher); None: it keeps none."""
        ...

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Change the batching parameters live (SIGHUP, the fleet's `set-batching`).

        Raises:
            ModelControlError: this scheduler has no batcher of its own (an ensemble).
        """
        ...

    async def submit(
        self,
        request: ValidatedRequest,
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        sequence: SequenceRequest | None = None,
        responses: ResponseSink | None = None,
    ) -> ExecutionResult:
        """Queue a validated request and wait for its outputs.

        `priority` and `timeout_us` are the request's `priority` and `timeout` parameters;
        `sequence` its correlation id and START/END flags; `responses` (a decoupled model) where
        its responses go as the model sends them: the result then holds no outputs.

        Raises:
            AgentError: the request was refused or failed (queue full or timed out, version
                unloading, the runtime failed, ...).
        """
        ...

    async def drain(self) -> None:
        """Wait until nothing is queued or executing."""
        ...

    def close(self, reason: str = "was unloaded") -> None:
        """Refuse new work and fail whatever is still queued, saying why (`reason`)."""
        ...
