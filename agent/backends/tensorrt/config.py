"""Complete a TensorRT model's config from its engine, as Triton's tensorrt_backend does.

Pure: a config and a deserialized engine in, the completed config (or a `ModelConfigError` in
Triton's words) out. The engine is read only through TensorRT's published Python API
(`tensorrt.ICudaEngine`: `num_io_tensors`, `get_tensor_name`, `get_tensor_mode`,
`get_tensor_shape`, `get_tensor_dtype`, `get_tensor_format`, `is_shape_inference_io`,
`num_optimization_profiles`, `get_tensor_profile_shape`, `get_tensor_profile_values`, and for
TensorRT 8 implicit-batch engines `has_implicit_batch_dimension` and `max_batch_size`); enum
values are compared by their `.name`, so nothing here imports TensorRT.

What it fills, following tensorrt_backend `ModelState::AutoCompleteConfigHelper` (it runs whether
or not the config lists inputs and outputs):

- max_batch_size: the largest batch (first dimension of the kMAX shape, or kMAX value of a shape
  tensor, smallest over the inputs) of the profiles the instance groups name (profile 0 when none
  do), or an implicit-batch engine's `max_batch_size`. Listed tensor dims are a hint: rank one
  below the engine's means batching; listed dims that all match the engine's rank mean no
  batching (max_batch_size 0). A config max_batch_size above the engine's is refused.
- an empty `dynamic_batching` when the engine's max batch is over 1 and no scheduler is set.
- the input and output lists when empty; in listed tensors, a missing data type and dims, and
  `is_shape_tensor` / `is_non_linear_format_io` from the engine. Dims leave out the batch
  dimension when batching (explicit batch); a tensor with no dimension left gets dims [1] and
  an empty reshape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc

_INT_MAX = 2**31 - 1
# tensorrt_backend ConvertTrtTypeToConfigDataType, by `tensorrt.DataType` member name; others
# (FP8, INT4, ...) have no config type.
_DATA_TYPES = {
    "FLOAT": mc.TYPE_FP32,
    "HALF": mc.TYPE_FP16,
    "INT8": mc.TYPE_INT8,
    "UINT8": mc.TYPE_UINT8,
    "BF16": mc.TYPE_BF16,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "BOOL": mc.TYPE_BOOL,
}


class Engine(Protocol):
    """The part of `tensorrt.ICudaEngine` (TensorRT 10 Python API) auto-complete reads."""

    @property
    def num_io_tensors(self) -> int: ...

    @property
    def num_optimization_profiles(self) -> int: ...

    def get_tensor_name(self, index: int) -> str: ...

    def get_tensor_mode(self, name: str) -> Any: ...

    def get_tensor_shape(self, name: str) -> Iterable[int]: ...

    def get_tensor_dtype(self, name: str) -> Any: ...

    def get_tensor_format(self, name: str) -> Any: ...

    def is_shape_inference_io(self, name: str) -> bool: ...

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> Sequence[Any]: ...

    def get_tensor_profile_values(self, profile_index: int, name: str) -> Sequence[Any]: ...


def complete_from_engine(config: mc.ModelConfig, engine: Engine, model: str) -> mc.ModelConfig:
    """Return a copy of `config` completed from `engine` (see the module docstring).

    Raises:
        ModelConfigError: a listed tensor the engine does not have, a max_batch_size or profile
            the engine does not support, contradicting batch hints, or a wrong shape-tensor or
            IO-format flag; each in Triton's words.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n).name == "INPUT"]
    outputs = [n for n in names if n not in inputs]
    implicit = bool(getattr(engine, "has_implicit_batch_dimension", False))
    hint, shaped = _batch_hint(out, engine, model, inputs, outputs)
    if implicit:
        max_batch = int(getattr(engine, "max_batch_size", 1))
        implicit_batching = max_batch != 1 or out.max_batch_size != 0
    else:
        max_batch = _max_profile_batch(out, engine, model, inputs)
        implicit_batching = False
    if hint and max_batch == 0:
        raise ModelConfigError(
            f"autofill failed for model '{model}': model tensor shape configuration hints for "
            "dynamic batching but the underlying engine doesn't support batching."
        )
    if shaped and not hint and not implicit_batching:
        max_batch = 0  # "The specified dimensions in model config ... hints that batching is
        # unavailable"
    if out.max_batch_size == 0:
        out.max_batch_size = max_batch
    elif out.max_batch_size > max_batch:
        raise ModelConfigError(
            f"autofill failed for model '{model}': configuration specified max-batch "
            f"{out.max_batch_size} but TensorRT engine only supports max-batch {max_batch}"
        )
    batcher_set = out.HasField("dynamic_batching") or out.HasField("sequence_batching")
    if max_batch > 1 and not batcher_set:
        out.dynamic_batching.SetInParent()
    skip_first = out.max_batch_size != 0 and not implicit
    for declared, tensors in ((out.input, inputs), (out.output, outputs)):
        reference = [_reference(engine, name, skip_first) for name in tensors]
        _fix_io(declared, reference)
    return out


def _config_dims(entry: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)


def _batch_hint(
    config: mc.ModelConfig,
    engine: Engine,
    model: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
) -> tuple[bool, int]:
    """Whether listed tensors hint at batching, and how many give a shape.

    tensorrt_backend `AutoCompleteConfigHelper` and `ExtractBatchHintFromIOConfig`: a tensor
    allowing ragged batches is a hint in itself (and ends the scan); a tensor whose dims are one
    rank short of the engine's (for a shape tensor: whose length is one short) is a hint, and
    once hinted, a tensor that is not contradicts it.
    """
    hint, shaped, ragged = False, 0, False
    for kind, declared, allowed in (
        ("input", config.input, inputs),
        ("output", config.output, outputs),
    ):
        for entry in declared:
            if ragged:
                break
            if isinstance(entry, mc.ModelInput) and entry.allow_ragged_batch:
                hint = ragged = True
                continue
            dims = _config_dims(entry)
            shaped += 1 if dims else 0
            if entry.name not in allowed:
                raise ModelConfigError(
                    f"unexpected inference {kind} '{entry.name}', allowed {kind}s are: "
                    f"{', '.join(sorted(allowed))}"
                )
            if not dims:
                continue
            shape = list(engine.get_tensor_shape(entry.name))
            if engine.is_shape_inference_io(entry.name):
                should_batch = bool(shape) and shape[0] == dims[0] + 1
            else:
                should_batch = len(shape) == len(dims) + 1
            hint = hint or should_batch
            if hint and not should_batch:
                raise ModelConfigError(
                    f"unable to autofill for '{model}', model tensor configurations are "
                    "contradicting each other in terms of whether batching is supported"
                )
    return hint, shaped


def _max_profile_batch(
    config: mc.ModelConfig, engine: Engine, model: str, inputs: Sequence[str]
) -> int:
    """tensorrt_backend `GetMaxSupportedBatchSize`: over the profiles the instance groups name
    (profile 0 when none), the largest of each profile's smallest kMAX first dimension."""
    count = engine.num_optimization_profiles
    profiles: set[int] = set()
    for group in config.instance_group:
        for profile in group.profile:
            index = int(profile) if profile.isdigit() else -1
            if not 0 <= index < count:
                raise ModelConfigError(
                    f"unable to autofill for '{model}', configuration specified invalid profile "
                    f"{profile} . Number of profiles supported by TensorRT engine: {count}"
                )
            profiles.add(index)
    best = 0
    for index in sorted(profiles or {0}):
        smallest = _INT_MAX
        for name in inputs:
            if engine.is_shape_inference_io(name):
                largest = list(engine.get_tensor_profile_values(index, name)[2])
            else:
                largest = list(engine.get_tensor_profile_shape(name, index)[2])
            smallest = min(smallest, int(largest[0]) if largest else 0)
        best = max(best, smallest)
    return best


def _reference(engine: Engine, name: str, skip_first: bool) -> mc.ModelInput:
    """tensorrt_backend `GetRefIO` and `InitIODims`: one tensor as the engine declares it."""
    shape = [int(d) for d in engine.get_tensor_shape(name)]
    shape_tensor = engine.is_shape_inference_io(name)
    entry = mc.ModelInput(
        name=name.split(" ", maxsplit=1)[0],
        data_type=_DATA_TYPES.get(engine.get_tensor_dtype(name).name, mc.TYPE_INVALID),
        is_shape_tensor=shape_tensor,
        is_non_linear_format_io=engine.get_tensor_format(name).name != "LINEAR",
    )
    if shape_tensor:
        if shape:
            entry.dims.append(shape[0] - 1 if skip_first else shape[0])
        return entry
    entry.dims.extend(shape[1:] if skip_first else shape)
    if not entry.dims:
        entry.dims.append(1)
        entry.reshape.SetInParent()
    return entry


def _fix_io(
    declared: RepeatedCompositeFieldContainer[mc.ModelInput]
    | RepeatedCompositeFieldContainer[mc.ModelOutput],
    reference: Sequence[mc.ModelInput],
) -> None:
    """tensorrt_backend `FixIO`: an empty list becomes the engine's; listed tensors get what
    they leave out, and their shape-tensor and IO-format flags checked against the engine."""
    if not declared:
        for ref in reference:
            entry = declared.add(name=ref.name, data_type=ref.data_type, dims=ref.dims)
            if ref.HasField("reshape"):
                entry.reshape.SetInParent()
            entry.is_shape_tensor = ref.is_shape_tensor
            entry.is_non_linear_format_io = ref.is_non_linear_format_io
        return
    by_name = {ref.name: ref for ref in reference}
    for entry in declared:
        engine_io = by_name.get(entry.name)
        if engine_io is None:
            continue
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = engine_io.data_type
        if not entry.dims:
            entry.dims.extend(engine_io.dims)
            if engine_io.HasField("reshape") and not entry.HasField("reshape"):
                entry.reshape.SetInParent()
        if entry.is_shape_tensor and not engine_io.is_shape_tensor:
            raise ModelConfigError(f"'{entry.name}' is incorrectly specified as a shape tensor.")
        entry.is_shape_tensor = engine_io.is_shape_tensor
        if entry.is_non_linear_format_io and not engine_io.is_non_linear_format_io:
            raise ModelConfigError(
                f"'{entry.name}' uses a linear IO format, but 'is_non_linear_format_io' is "
                "incorrectly set to true in the model configuration."
            )
        entry.is_non_linear_format_io = engine_io.is_non_linear_format_io
