"""What every inference backend offers the agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

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
