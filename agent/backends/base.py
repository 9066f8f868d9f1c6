"""What every inference backend offers the agent."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from agent.errors import AgentError
from agent.tensors.datatypes import ModelTensor


class Backend(Protocol):
    """A loaded model version that runs a batch of named tensors."""

    @property
    def inputs(self) -> Sequence[ModelTensor]: ...

    @property
    def outputs(self) -> Sequence[ModelTensor]: ...

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        """Run the model; blocking, called on the model's executor (or inline on the event
        loop once the scheduler measured it as tiny).

        `shrink_memory` asks the runtime to hand unused memory back afterwards (once, after the
        footprint has been measured).
        """
        ...

    def close(self) -> None:
        """Release the runtime's resources."""
        ...


class ResponseSink(Protocol):
    """Where a decoupled backend puts one request's responses (from any thread)."""

    def put(self, outputs: list[np.ndarray] | None, error: AgentError | None, final: bool) -> None:
        """One response (outputs, or an error) and/or the final flag (outputs None)."""
        ...

    def on_cancel(self, cancel: Callable[[], None]) -> None:
        """Call `cancel` when the client cancels (at once if it already has)."""
        ...
