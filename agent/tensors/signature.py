"""A model's tensor contract, and the checks a request must pass before it reaches a backend.

Built from a completed config: names, KServe datatypes, dims (with -1 for any size), the batch
dimension when max_batch_size > 0, and reshapes between what clients send and what the model takes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.errors import InvalidInputError, ModelConfigError, UnknownTensorError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes
from agent.tensors.request import InferRequest, RequestContext


@dataclass(frozen=True, slots=True)
class TensorContract:
    """One input or output as clients see it (dims exclude the batch dimension)."""

    name: str
    datatype: str  # KServe name
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None  # the model's own dims, when they differ
    optional: bool = False

    def metadata(self, batched: bool) -> dict[str, Any]:
        """The tensor in KServe model-metadata form."""
        shape = [-1, *self.dims] if batched else list(self.dims)
        return {"name": self.name, "datatype": self.datatype, "shape": shape}


@dataclass(frozen=True, slots=True)
class ValidatedRequest:
    """Inputs ready for the backend, the outputs to compute, and the batch size (1 if unbatched)."""

    feeds: dict[str, np.ndarray]
    output_names: tuple[str, ...]
    batch_size: int
    # The request's trace (the data plane's type, opaque down here), or None: untraced. An
    # ensemble hands it to its steps and a Python model to its BLS requests (child traces).
    trace: object | None = None
    # The request's id, parameters and correlation id (None: none of them set).
    context: RequestContext | None = None


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a model accepts and returns."""

    model_name: str
    max_batch_size: int
    inputs: Mapping[str, TensorContract]
    outputs: Mapping[str, TensorContract]

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> ModelSignature:
        """Build the contract from a completed config."""
        return cls(
            model_name=config.name,
            max_batch_size=config.max_batch_size,
            inputs={t.name: _contract(t, t.optional) for t in config.input},
            outputs={t.name: _contract(t, False) for t in config.output},
        )

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def validate(self, request: InferRequest) -> ValidatedRequest:
        """Check a request against the contract and prepare the backend's feeds.

        Raises:
            InvalidInputError: unknown, missing or repeated inputs, wrong datatype or shape, a batch
                over max_batch_size, inputs with different batch sizes, unknown requested outputs.
        """
        names = [tensor.name for tensor in request.inputs]
        given: set[str] = set()
        for name in names:  # Triton refuses a repeated input as it is added, before the rest
            if name in given:
                raise InvalidInputError(f"input '{name}' already exists in request")
            given.add(name)
        required = [n for n, c in self.inputs.items() if not c.optional]
        if not len(required) <= len(names) <= len(self.inputs):
            raise InvalidInputError(self._count_error(names, required))
        checked: list[tuple[str, np.ndarray]] = []
        batch_size = 0
        # Last to first, as Triton checks them (its request keeps inputs in a hash map that, in
        # practice, iterates so): with several inputs wrong, the same one is named.
        for tensor in reversed(request.inputs):
            contract = self.inputs.get(tensor.name)
            if contract is None:
                raise UnknownTensorError(
                    f"unexpected inference input '{tensor.name}' for model '{self.model_name}' "
                    f"(expected: {', '.join(self.inputs)})"
                )
            if tensor.datatype != contract.datatype:
                raise InvalidInputError(
                    f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                    f"'{self.model_name}' expects '{contract.datatype}'"
                )
            shape = tensor.shape
            if self.batched:
                if not shape:
                    raise InvalidInputError(
                        f"input '{tensor.name}' needs a batch dimension: model '{self.model_name}' "
                        f"expects shape [-1, {', '.join(map(str, contract.dims))}]"
                    )
                batch = shape[0]
                if batch < 1 or batch > self.max_batch_size:
                    raise InvalidInputError(
                        f"inference request batch-size must be <= {self.max_batch_size} for "
                        f"'{self.model_name}' (got {batch} in input '{tensor.name}')"
                    )
                if batch_size and batch != batch_size:
                    raise InvalidInputError(
                        f"input '{tensor.name}' batch size does not match other inputs for "
                        f"'{self.model_name}' ({batch}, the others {batch_size})"
                    )
                batch_size = batch
                item_shape = shape[1:]
            else:
                item_shape = shape
            if not _matches(item_shape, contract.dims):
                expected = [-1, *contract.dims] if self.batched else list(contract.dims)
                raise InvalidInputError(
                    f"unexpected shape for input '{tensor.name}' for model '{self.model_name}'. "
                    f"Expected {_dims_text(expected)}, got {_dims_text(shape)}."
                    + (_BATCH_NOTE if self.batched else "")
                )
            data = tensor.data
            if contract.reshape is not None:
                target = (shape[0], *contract.reshape) if self.batched else contract.reshape
                data = data.reshape(target)
            checked.append((tensor.name, data))
        feeds = dict(reversed(checked))  # the request's order, which backends see
        if any(n not in feeds for n in required):  # optional inputs given in their place
            raise InvalidInputError(self._count_error(names, required))
        return ValidatedRequest(feeds, self.output_names(request), batch_size or 1)

    def _count_error(self, names: Sequence[str], required: Sequence[str]) -> str:
        """Triton's words for inputs that do not add up: those given (last to first, as Triton
        lists them) and the required ones missing (an empty list reads `]`, as Triton's)."""
        got = "[" + ",".join(f"'{n}'" for n in reversed(names)) + "]"
        missing = ",".join(f"'{n}'" for n in required if n not in names)
        expected = (
            f"expected {len(self.inputs)} inputs"
            if len(required) == len(self.inputs)
            else f"expected number of inputs between {len(required)} and {len(self.inputs)}"
        )
        return (
            f"{expected} but got {len(names)} inputs for model '{self.model_name}'. "
            f"Got input(s) {got}, but missing required input(s) "
            f"{'[' + missing if missing else ''}]. Please provide all required input(s)."
        )

    def output_names(self, request: InferRequest) -> tuple[str, ...]:
        """The outputs to compute: those requested, or all of them."""
        if request.outputs is None:
            return tuple(self.outputs)
        names = []
        for out in request.outputs:
            if out.name not in self.outputs:
                raise UnknownTensorError(
                    f"unexpected inference output '{out.name}' for model '{self.model_name}'"
                )
            names.append(out.name)
        return tuple(names)

    def shape_output(self, name: str, data: np.ndarray) -> np.ndarray:
        """Undo an output reshape so clients see the config's dims.

        A scalar a model returns for an output whose dims are ones (Triton writes [1] for it) is
        reported in those dims, as Triton's ONNX Runtime backend reports it.
        """
        contract = self.outputs[name]
        if contract.reshape is None:
            if data.ndim == 0 and not self.batched and math.prod(contract.dims) == 1:
                return data.reshape(contract.dims)
            return data
        lead = data.shape[:1] if self.batched else ()
        return data.reshape((*lead, *contract.dims))


# What Triton adds to a wrong shape for a model that batches.
_BATCH_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be"
    " prepended to each input shape. If you want to specify the full shape including the batch dim"
    " in your input dims config, try setting max_batch_size to zero. See the model configuration"
    " docs for more info on max_batch_size."
)


def _contract(tensor: mc.ModelInput | mc.ModelOutput, optional: bool) -> TensorContract:
    dt = datatypes.from_config(mc.DataType.Name(tensor.data_type))
    if dt is None:
        raise ModelConfigError(f"tensor '{tensor.name}' has an unsupported data_type")
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorContract(tensor.name, dt.kserve, tuple(tensor.dims), reshape, optional)


def _matches(shape: Sequence[int], dims: Sequence[int]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or s == d for s, d in zip(shape, dims, strict=True))


def _dims_text(dims: Sequence[int]) -> str:
    """Dimensions as Triton's messages write them: `[-1,64]`."""
    return "[" + ",".join(str(d) for d in dims) + "]"
