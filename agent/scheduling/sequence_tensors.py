"""The tensors the sequence batcher adds to a model's inputs: controls and implicit state.

Controls (`sequence_batching.control_input`) tell the model, per batch row, whether the request
starts or ends its sequence, that the row holds a request (READY) and its correlation id. Implicit
state (`sequence_batching.state`) is a tensor the model returns with each request and gets back
as an input with the next request of the same sequence; the agent keeps it in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import InvalidInputError, ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.scheduling.sequence_policy import CorrelationId
from agent.tensors import datatypes

_Kind = mc.ModelSequenceBatching.Control.Kind


@dataclass(frozen=True, slots=True)
class ControlInput:
    """One control tensor: its name, what it tells and the values for false and true."""

    name: str
    kind: mc.ModelSequenceBatching.Control.Kind
    dtype: np.dtype[Any]
    false_true: tuple[object, object] = (0, 1)
    kserve: str = ""  # CORRID only: its KServe datatype, for errors


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One implicit state: the input that receives it, the output that returns it, its start."""

    input_name: str
    output_name: str
    initial: np.ndarray  # without the batch dimension

    @property
    def nbytes(self) -> int:
        return int(self.initial.nbytes)


@dataclass(frozen=True, slots=True)
class SequenceTensors:
    """A sequence model's controls and states, read from its config."""

    model: str
    batched: bool
    controls: tuple[ControlInput, ...]
    states: tuple[StateTensor, ...]

    @classmethod
    def from_config(cls, config: mc.ModelConfig, model_dir: Path | None = None) -> SequenceTensors:
        """Read `control_input` and `state`; `initial_state.data_file` is read from
        `<model_dir>/initial_state/`.

        Raises:
            ModelConfigError: a control or state that cannot be built (type, dims, data file).
        """
        sb = config.sequence_batching
        controls = []
        for tensor in sb.control_input:
            for control in tensor.control:
                controls.append(_control(config.name, tensor.name, control))
        states = tuple(_state(config.name, s, model_dir) for s in sb.state)
        return cls(config.name, config.max_batch_size > 0, tuple(controls), states)

    @property
    def input_names(self) -> frozenset[str]:
        """Model inputs the agent feeds (clients do not send them)."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(s.output_name for s in self.states)

    @property
    def state_bytes(self) -> int:
        """Bytes one sequence's state holds (its initial size)."""
        return sum(s.nbytes for s in self.states)

    def check_corrid(self, corrid: CorrelationId) -> None:
        """Triton's check that a correlation id's type fits the CORRID control.

        Raises:
            InvalidInputError: a string id for a numeric CORRID, or a number for a string one.
        """
        for c in self.controls:
            if c.kind != _Kind.CONTROL_SEQUENCE_CORRID:
                continue
            is_string = c.dtype == np.object_
            if isinstance(corrid, str) != is_string:
                got = "BYTES" if isinstance(corrid, str) else "UINT64"
                want = c.kserve
                raise InvalidInputError(
                    f"sequence batching control '{c.name}' data-type is '{got}', but model "
                    f"'{self.model}' expects '{want}'"
                )

    def control_feeds(
        self, rows: Sequence[tuple[CorrelationId, bool, bool]]
    ) -> dict[str, np.ndarray]:
        """Control tensors for a batch: one row per (correlation id, start, end)."""
        feeds: dict[str, np.ndarray] = {}
        for c in self.controls:
            values: list[object] = []
            for corrid, start, end in rows:
                if c.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                    values.append(corrid.encode() if isinstance(corrid, str) else corrid)
                    continue
                flag = {
                    _Kind.CONTROL_SEQUENCE_START: start,
                    _Kind.CONTROL_SEQUENCE_END: end,
                    _Kind.CONTROL_SEQUENCE_READY: True,
                }[c.kind]
                values.append(c.false_true[int(flag)])
            array = np.array(values, dtype=c.dtype).reshape(len(rows), 1)
            feeds[c.name] = array if self.batched else array[0]
        return feeds

    def starting_feeds(self, batch: int) -> dict[str, np.ndarray]:
        """Controls and initial states of `batch` sequences starting (zero and warm-up runs)."""
        rows: list[tuple[CorrelationId, bool, bool]] = [(1, True, False)] * batch
        return {**self.control_feeds(rows), **self.state_feeds([None] * batch)}

    def state_feeds(self, held: Sequence[dict[str, np.ndarray] | None]) -> dict[str, np.ndarray]:
        """State inputs for a batch: each row's held state, or the initial one (None)."""
        feeds = {}
        for s in self.states:
            rows = [s.initial if h is None else h[s.output_name] for h in held]
            feeds[s.input_name] = np.stack(rows) if self.batched else rows[0]
        return feeds


def _control(model: str, name: str, control: mc.ModelSequenceBatching.Control) -> ControlInput:
    if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
        dt = datatypes.from_config(mc.DataType.Name(control.data_type))
        if dt is None or dt.kserve not in ("UINT64", "INT64", "UINT32", "INT32", "BYTES"):
            raise ModelConfigError(
                f"sequence batching control '{name}' of model '{model}' must have data_type "
                "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
            )
        return ControlInput(name, control.kind, np.dtype(dt.numpy), kserve=dt.kserve)
    if control.int32_false_true:
        pair = tuple(control.int32_false_true)
        return ControlInput(name, control.kind, np.dtype(np.int32), (pair[0], pair[1]))
    if control.fp32_false_true:
        floats = tuple(control.fp32_false_true)
        return ControlInput(name, control.kind, np.dtype(np.float32), (floats[0], floats[1]))
    if control.bool_false_true:
        pair = tuple(control.bool_false_true)
        return ControlInput(name, control.kind, np.dtype(np.bool_), (pair[0], pair[1]))
    raise ModelConfigError(
        f"sequence batching control '{name}' of model '{model}' must specify either "
        "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
    )


def _state(
    model: str, state: mc.ModelSequenceBatching.State, model_dir: Path | None
) -> StateTensor:
    dt = datatypes.from_config(mc.DataType.Name(state.data_type))
    if dt is None or dt.kserve == "BYTES":
        raise ModelConfigError(
            f"state '{state.input_name}' of model '{model}': data_type must be a numeric type"
        )
    dims = tuple(max(d, 1) for d in state.dims)
    initial = np.zeros(dims, dt.numpy)
    for init in state.initial_state:
        init_dims = tuple(init.dims) or dims
        if any(d < 0 for d in init_dims):
            raise ModelConfigError(
                f"'initial_state' dim for input name '{state.input_name}' of model '{model}' "
                "must be non-negative"
            )
        if init.WhichOneof("state_data") == "data_file":
            if model_dir is None:
                raise ModelConfigError(f"state '{state.input_name}': no model directory")
            path = model_dir / "initial_state" / init.data_file
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise ModelConfigError(
                    f"initial_state data file '{init.data_file}' of model '{model}': {exc}"
                ) from None
            count = int(np.prod(init_dims))
            if len(raw) != count * dt.numpy.itemsize:
                raise ModelConfigError(
                    f"initial_state data file '{init.data_file}' of model '{model}' has "
                    f"{len(raw)} bytes, expected {count * dt.numpy.itemsize}"
                )
            initial = np.frombuffer(raw, dt.numpy).reshape(init_dims).copy()
        else:
            initial = np.zeros(init_dims, dt.numpy)
    return StateTensor(state.input_name, state.output_name, initial)
