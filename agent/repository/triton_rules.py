"""Triton's own config rules, refused with messages worded as Triton words them.

Written from Triton's public model_config.proto comments, its model configuration guide and what
its server core refuses at load; an operator moving a repository from Triton gets the same verdict
here. Two passes, both pure (a config in, a `ModelConfigError` naming the first problem out):

- `check_config` runs on the config as written, before auto-complete: the rules that need no
  model file (dynamic batching priorities and ordering, sequence batching controls, instance
  groups, ensemble scheduling and its data flow, model metrics, batch input kinds, reshape sizes).
- `agent.repository.model_rules` runs once the model file is open, before auto-complete: a
  config tensor that the model does not have, and (ONNX models) the number of inputs.
- `validate_completed` runs on the completed config: the rules that depend on what auto-complete
  fills (max_batch_size, the backend, the full input and output lists, concrete instance kinds).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.ensemble_rules import check_ensemble

TENSORRT_PLATFORM = "tensorrt_plan"
WILDCARD_DIM = -1
# Backends that cannot send a request's responses apart from its execution (Triton's decoupled
# mode); the Python backend can.
NOT_DECOUPLED_BACKENDS = frozenset({"onnxruntime", "tensorrt"})

_Control = mc.ModelSequenceBatching.Control
_Group = mc.ModelInstanceGroup
_BOOLEAN_CONTROLS = (
    _Control.CONTROL_SEQUENCE_START,
    _Control.CONTROL_SEQUENCE_END,
    _Control.CONTROL_SEQUENCE_READY,
)
_CORRID_TYPES = frozenset(
    {mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING}
)


def _fail(message: str) -> ModelConfigError:
    return ModelConfigError(message)


# --- before auto-complete -------------------------------------------------------------------


def check_config(config: mc.ModelConfig, model_name: str) -> None:
    """Triton's rules that need neither the model file nor auto-complete.

    Raises:
        ModelConfigError: the first rule broken, in Triton's words.
    """
    name = config.name or model_name
    tensors: list[tuple[str, mc.ModelInput | mc.ModelOutput]] = [
        *(("model input ", t) for t in config.input),
        *(("model output ", t) for t in config.output),
    ]
    for prefix, tensor in tensors:
        _check_reshape(tensor, prefix, name)
    _check_batch_io_kinds(config, name)
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config.dynamic_batching, name)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(config, name)
    check_ensemble(config, name)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise _fail(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    _check_model_metrics(config.model_metrics)
    _check_instance_groups(config, name)


def _check_reshape(tensor: mc.ModelInput | mc.ModelOutput, prefix: str, model: str) -> None:
    if not tensor.HasField("reshape"):
        return
    label = f"{prefix}'{tensor.name}' "
    shape = list(tensor.reshape.shape)
    if any(d < 1 and d != WILDCARD_DIM for d in shape):
        raise _fail(
            f"{label}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size "
            f"dimension for {model} (reshape {shape})"
        )
    dims = list(tensor.dims)
    if not dims:
        return  # auto-complete fills dims from the model; checked again after it
    _check_reshape_sizes(dims, shape, label, model)


def _element_count(dims: Sequence[int]) -> int:
    """Triton's count: -1 with a variable-size dimension, 0 for no dimensions."""
    if WILDCARD_DIM in dims:
        return WILDCARD_DIM
    return math.prod(dims) if dims else 0


def _trunks(dims: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable-size ones."""
    counts, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def _check_reshape_sizes(dims: Sequence[int], shape: Sequence[int], label: str, model: str) -> None:
    dims_size, shape_size = _element_count(dims), _element_count(shape)
    detail = f" (dims {list(dims)}, reshape {list(shape)})"
    # An empty reshape (a scalar) takes dims holding one element.
    if dims_size != shape_size and (shape_size != 0 or dims_size != 1):
        raise _fail(f"{label}has different size for dims and reshape for {model}{detail}")
    if dims_size == WILDCARD_DIM:
        ours, theirs = _trunks(dims), _trunks(shape)
        if len(ours) != len(theirs):
            raise _fail(
                f"{label}has different number of variable-size dimensions for dims and reshape "
                f"for {model}{detail}"
            )
        if ours != theirs:
            raise _fail(f"{label}has different size for dims and reshape for {model}{detail}")


def _check_batch_io_kinds(config: mc.ModelConfig, model: str) -> None:
    for batch_input in config.batch_input:
        kind = mc.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise _fail(
                f"batch input kind '{kind}' expects 1 source input, got "
                f"{len(batch_input.source_input)} for {model}"
            )
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise _fail(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {model}")
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise _fail(
                f"batch output kind '{kind}' expects 1 source input, got "
                f"{len(batch_output.source_input)} for {model}"
            )
        seen: set[str] = set()
        for target in batch_output.target_name:
            if target in seen:
                raise _fail(f"target output name '{target}' can only be specified once for {model}")
            seen.add(target)


def _check_dynamic_batching(batching: mc.ModelDynamicBatching, model: str) -> None:
    if any(size <= 0 for size in batching.preferred_batch_size):
        raise _fail(
            f"dynamic batching preferred size must be positive for {model} "
            f"(preferred_batch_size {list(batching.preferred_batch_size)})"
        )
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            raise _fail(
                f"default priority level must be in range [1, {levels}] for {model} "
                f"(default_priority_level {batching.default_priority_level})"
            )
        bad = sorted(k for k in batching.priority_queue_policy if not 1 <= k <= levels)
        if bad:
            raise _fail(
                f"priority queue policy must have priority level in range [1, {levels}] for "
                f"{model} (priority_queue_policy keys {bad})"
            )
    if batching.preserve_ordering:
        if levels > 1:
            raise _fail(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {model}"
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(
            p.default_timeout_microseconds != 0 and p.timeout_action == mc.ModelQueuePolicy.DELAY
            for p in policies
        ):
            raise _fail(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                f"true for {model}"
            )


def _check_sequence_batching(config: mc.ModelConfig, model: str) -> None:
    if config.response_cache.enable:
        raise _fail(
            f"Response Cache does not currently support model {model} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    batcher = config.sequence_batching
    seen: set[str] = set()
    for control_input in batcher.control_input:
        if not control_input.name:
            raise _fail(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen:
            raise _fail(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {model}"
            )
        seen.add(control_input.name)
    for kind in (*_BOOLEAN_CONTROLS, _Control.CONTROL_SEQUENCE_CORRID):
        _check_control_kind(batcher, kind, model)
    if batcher.HasField("oldest") and any(s <= 0 for s in batcher.oldest.preferred_batch_size):
        raise _fail(f"sequence batching preferred batch size must be positive for {model}")
    if batcher.HasField("direct"):
        utilization = batcher.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise _fail(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for "
                f"{model}"
            )


def _check_control_kind(batcher: mc.ModelSequenceBatching, kind: int, model: str) -> None:
    kind_name = _Control.Kind.Name(kind)
    controls = [c for ci in batcher.control_input for c in ci.control if c.kind == kind]
    if len(controls) > 1:
        raise _fail(f"sequence batching specifies multiple {kind_name} tensors for {model}")
    if not controls:
        return
    (control,) = controls
    given = [
        field
        for field, values in (
            ("int32_false_true", control.int32_false_true),
            ("fp32_false_true", control.fp32_false_true),
            ("bool_false_true", control.bool_false_true),
        )
        if len(values) > 0
    ]
    if kind == _Control.CONTROL_SEQUENCE_CORRID:
        if given:
            raise _fail(
                "sequence batching must not specify either 'int32_false_true', "
                f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}"
            )
        if control.data_type not in _CORRID_TYPES:
            raise _fail(
                f"unexpected data type for control {kind_name} for {model}. Allowed data types "
                "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
            )
        return
    if not given:
        raise _fail(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind_name} for {model}"
        )
    if len(given) > 1:
        raise _fail(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {model}"
        )
    field = given[0]
    if len(getattr(control, field)) != 2:
        raise _fail(
            f"sequence batching control '{field}' must have exactly 2 entries for {kind_name} "
            f"for {model}"
        )


def _check_model_metrics(metrics: mc.ModelMetrics) -> None:
    for control in metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise _fail("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise _fail("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise _fail("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise _fail("histogram options must specify non-empty 'buckets'")


def _group_name(group: mc.ModelInstanceGroup, index: int, model: str) -> str:
    return group.name or f"{model}_{index}"  # the name Triton gives an unnamed group


def _check_instance_groups(config: mc.ModelConfig, model: str) -> None:
    for index, group in enumerate(config.instance_group):
        label = f"instance group {_group_name(group, index, model)} of model {model}"
        kind = _Group.Kind.Name(group.kind)
        if group.kind in (_Group.KIND_CPU, _Group.KIND_MODEL) and group.gpus:
            raise _fail(f"{label} has kind {kind} but specifies one or more GPUs")
        negative = [g for g in group.gpus if g < 0]
        if negative:
            raise _fail(f"{label} specifies invalid or unsupported gpu id {negative[0]}")
        if group.profile and config.platform not in ("", TENSORRT_PLATFORM):
            raise _fail(
                f"{label} and platform {config.platform} specifies profile field which is only "
                "supported for TensorRT models"
            )
        for profile in group.profile:
            if not (profile.isascii() and profile.isdigit()):
                raise _fail(
                    f"{label} and platform {config.platform} specifies invalid profile {profile}. "
                    "The field should contain the string representation of a non-negative "
                    "integer."
                )


# --- after auto-complete --------------------------------------------------------------------


def validate_completed(
    config: mc.ModelConfig, model_name: str, *, gpus: Collection[int] | None = None
) -> None:
    """Triton's rules on the completed config (max_batch_size, backend and tensors filled).

    Args:
        config: the config auto-complete returned.
        model_name: the model's directory name.
        gpus: the GPU ids this agent can run instances on; empty where its runtime has no GPU
            support (a `KIND_GPU` group is then refused, as Triton's CPU-only builds refuse it);
            None when unknown (not checked).

    Raises:
        ModelConfigError: the first rule broken, in Triton's words.
    """
    name = config.name or model_name
    max_batch = config.max_batch_size
    _check_tensors(config.input, "model input ", config, name)
    _check_tensors(config.output, "model output ", config, name)
    _check_batch_io_names(config, name)
    if config.HasField("dynamic_batching") and any(
        s > max_batch for s in config.dynamic_batching.preferred_batch_size
    ):
        raise _fail(
            f"dynamic batching preferred size must be <= max batch size for {name} "
            f"(preferred_batch_size {list(config.dynamic_batching.preferred_batch_size)}, "
            f"max_batch_size {max_batch})"
        )
    oldest = config.sequence_batching.oldest
    if config.sequence_batching.HasField("oldest") and any(
        s > max_batch for s in oldest.preferred_batch_size
    ):
        raise _fail(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if config.model_transaction_policy.decoupled and config.backend in NOT_DECOUPLED_BACKENDS:
        raise _fail(
            f"model '{name}': the '{config.backend}' backend does not support the 'decoupled' "
            "model transaction policy (only the 'python' backend does)"
        )
    if gpus is not None:
        _check_gpus(config, name, gpus)


def _check_tensors(
    tensors: Iterable[mc.ModelInput | mc.ModelOutput],
    prefix: str,
    config: mc.ModelConfig,
    model: str,
) -> None:
    tensorrt = config.platform == TENSORRT_PLATFORM
    for tensor in tensors:
        label = f"{prefix}'{tensor.name}' "
        if tensor.HasField("reshape"):
            if not tensor.reshape.shape and config.max_batch_size == 0:
                raise _fail(
                    f"{label}cannot have empty reshape for non-batching model as scalar tensors "
                    f"are not supported for {model}"
                )
            if tensor.dims:
                _check_reshape_sizes(tensor.dims, tensor.reshape.shape, label, model)
        if (
            isinstance(tensor, mc.ModelInput)
            and tensor.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)
            and len(tensor.dims) != 3
        ):
            raise _fail(f"model input NHWC/NCHW require 3 dims for {model}")
        if tensor.is_shape_tensor and not tensorrt:
            raise _fail(f"shape tensors are only supported for TensorRT platform for {model}")
        if tensor.is_non_linear_format_io:
            if not tensorrt:
                raise _fail(
                    f"Non-linear IO format is only supported for the TensorRT platform for {model}"
                )
            if len(tensor.dims) != 3:
                kind = prefix.split()[1]
                raise _fail(f"Non-linear IO format {kind} requires 3 dims for {model}")


def _check_batch_io_names(config: mc.ModelConfig, model: str) -> None:
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    sources = [s for b in config.batch_input for s in b.source_input]
    sources += [s for b in config.batch_output for s in b.source_input]
    for source in sources:
        if source not in inputs:
            raise _fail(f"unknown source input name '{source}' for {model}")
    for batch_output in config.batch_output:
        for target in batch_output.target_name:
            if target not in outputs:
                raise _fail(f"unknown target output name '{target}' for {model}")


def _check_gpus(config: mc.ModelConfig, model: str, gpus: Collection[int]) -> None:
    for index, group in enumerate(config.instance_group):
        if group.kind != _Group.KIND_GPU:
            continue
        label = f"instance group {_group_name(group, index, model)} of model {model}"
        if not gpus:
            raise _fail(f"{label} has kind KIND_GPU but server does not support GPUs")
        for gpu in group.gpus:
            if gpu not in gpus:
                raise _fail(
                    f"{label} specifies invalid or unsupported gpu id {gpu}. GPUs available are: "
                    f"{', '.join(str(g) for g in sorted(gpus))}"
                )
