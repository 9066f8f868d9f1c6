"""Complete a model config from the model file, and refuse configs that contradict it.

The result is what Triton reports for the same model and config on a CPU-only device, in three
steps as Triton takes them:

- Server side, always (core `AutoCompleteBackendFields`): `name`, and `backend`, `platform` and
  `default_model_filename` from each other (`model.onnx`, `model.plan`, `model.py`).
- Backend side, unless auto-complete is off (`--disable-auto-complete-config`). ONNX models
  (onnxruntime_backend `AutoCompleteConfig`), and only while the config lists no inputs (nor
  batch inputs) or no outputs: a batchable model gets `max_batch_size` 4 (the server's
  `default-max-batch-size`) when it has none, and an empty `dynamic_batching` when
  max_batch_size > 1 and no scheduler is set; a model that cannot batch with a max_batch_size
  set is refused; the input list, when empty, and the output list, when empty, are filled from
  the model (a tensor with no dimension left becomes `dims: [1]`, with an empty `reshape` when
  batching). A config listing both inputs and outputs is left as written: max_batch_size 0
  stays 0 and no batcher is added. TensorRT engines are completed by their backend from the
  engine (`agent.backends.tensorrt.config`); Python models by their `auto_complete_config`.
  Beyond Triton, missing data types and dims of listed tensors are filled too (with
  auto-complete off they are refused, in Triton's words).
- Normalisation, always (core `NormalizeModelConfig`, `NormalizeInstanceGroup`): the version
  policy, `preferred_batch_size: [max_batch_size]` for a `dynamic_batching` that has none,
  pinned-memory optimization flags, and instance groups (see `_fill_instance_groups`).

Then, in both modes, Triton's load checks: the number of inputs the config expects against the
model's (an input list given only in part is refused, as the ONNX Runtime backend refuses it),
and a config that disagrees with the model (data type, rank, fixed dimension, a scalar given
dims other than 1) is refused with a message naming both sides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import default_instance_count
from agent.repository.model_rules import check_input_count
from agent.tensors.datatypes import ModelTensor

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_BACKEND = "tensorrt"
PYTHON_BACKEND = "python"  # Triton's Python backend has no platform
_SUPPORTED = {ONNX_PLATFORM: ONNX_BACKEND, TENSORRT_PLATFORM: TENSORRT_BACKEND}
DEFAULT_MAX_BATCH_SIZE = 4  # what Triton's ONNX Runtime backend picks when it can batch
# Triton core's AutoCompleteBackendFields: the file each backend loads from a version folder.
_DEFAULT_FILENAMES = {
    ONNX_BACKEND: "model.onnx",
    TENSORRT_BACKEND: "model.plan",
    PYTHON_BACKEND: "model.py",
}


def complete_config(
    config: mc.ModelConfig,
    model_name: str,
    inputs: Sequence[ModelTensor],
    outputs: Sequence[ModelTensor],
    *,
    auto_complete: bool,
) -> mc.ModelConfig:
    """Return a completed copy of `config` for a model with these tensors.

    Raises:
        ModelConfigError: the config contradicts the model, names a platform this backend does not
            run, or (without auto-complete) leaves out what the model needs.
    """
    out = named_copy(config, model_name)
    _check_platform(out)
    if out.max_batch_size < 0:
        raise ModelConfigError(f"model '{model_name}': max_batch_size must be >= 0")
    onnx = out.backend == ONNX_BACKEND
    if auto_complete and onnx:
        _onnx_auto_complete(out, inputs, outputs)
    # tensorrt_backend's CompareDimsSupported lets an engine's fixed first dimension batch.
    can_batch = out.backend == TENSORRT_BACKEND or _model_can_batch(inputs, outputs)
    if out.max_batch_size > 0 and not can_batch:
        fixed = next(t for t in (*inputs, *outputs) if not t.shape or t.shape[0] is not None)
        raise ModelConfigError(
            f"model '{model_name}': config max_batch_size is {out.max_batch_size} but the model's "
            f"'{fixed.name}' has no dynamic batch dimension (shape {_fmt(fixed.shape)})"
        )
    if onnx:
        check_input_count(out, model_name, inputs)
    # Control and state inputs are fed by the sequence batcher, never listed as inputs.
    fed = {c.name for c in out.sequence_batching.control_input}
    fed.update(s.input_name for s in out.sequence_batching.state)
    outputs = [
        t for t in outputs if t.name not in {s.output_name for s in out.sequence_batching.state}
    ]
    inputs = [t for t in inputs if t.name not in fed]
    # The ONNX Runtime backend fills a whole list or none; the others fill what they left out.
    _complete_tensors(out, out.input, inputs, "input", auto_complete, require_all=not onnx)
    _complete_tensors(out, out.output, outputs, "output", auto_complete, require_all=False)
    _fill_defaults(out)
    return out


def named_copy(config: mc.ModelConfig, model_name: str) -> mc.ModelConfig:
    """A copy of `config` named after its model directory (Triton's rule: an empty name takes
    the directory's).

    Raises:
        ModelConfigError: the config names another model.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    if not out.name:
        out.name = model_name
    elif out.name != model_name:
        raise ModelConfigError(
            f"config name '{out.name}' does not match the model directory '{model_name}'"
        )
    return out


def _onnx_auto_complete(
    config: mc.ModelConfig, inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor]
) -> None:
    """onnxruntime_backend `AutoCompleteConfig`, `AutoCompleteMaxBatch`, `AutoCompleteIO`.

    Skipped when the config lists inputs (or batch inputs) and outputs. A list that is empty is
    filled with every model tensor (names here; `_complete_one` writes types and dims).

    Raises:
        ModelConfigError: max_batch_size set for a model that cannot batch (Triton's words).
    """
    listed_inputs = len(config.input) + len(config.batch_input)
    if listed_inputs and config.output:
        return  # "skipping model configuration auto-complete ...: inputs and outputs already
        # specified"
    if _model_can_batch(inputs, outputs):
        if config.max_batch_size == 0:
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        batcher_set = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
        if config.max_batch_size > 1 and not batcher_set:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ModelConfigError(
            f"autofill failed for model '{config.name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )
    if not listed_inputs:
        for tensor in inputs:
            config.input.add(name=tensor.name)
    if not config.output:
        for tensor in outputs:
            config.output.add(name=tensor.name)


def _fill_defaults(config: mc.ModelConfig) -> None:
    """Defaults Triton writes into every config it reports (not subject to strict mode).

    Triton core's NormalizeModelConfig: version policy latest 1; a `dynamic_batching` without
    preferred sizes prefers `max_batch_size`; the same for `sequence_batching.oldest`, whose idle
    time defaults to 1 s; input and output pinned memory on (models that are not ensembles).
    """
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching") and config.max_batch_size > 0:
        preferred = config.dynamic_batching.preferred_batch_size
        if not preferred:
            preferred.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        sequence.max_sequence_idle_microseconds = (
            sequence.max_sequence_idle_microseconds or _SEQUENCE_IDLE_DEFAULT_US
        )
        oldest = sequence.oldest
        if (
            sequence.HasField("oldest")
            and not oldest.preferred_batch_size
            and config.max_batch_size > 0
        ):
            oldest.preferred_batch_size.append(config.max_batch_size)
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    _fill_instance_groups(config)


_SEQUENCE_IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS


def _fill_instance_groups(config: mc.ModelConfig) -> None:
    """Triton core's NormalizeInstanceGroup on a device without GPUs.

    No group at all: one named after the model (no backend here declares preferred groups).
    Each group: name `<model>_<index>` when unnamed, KIND_AUTO resolved to KIND_CPU (no GPU), and
    a missing count set by SetDefaultInstanceCount: 2 for a KIND_CPU group of the onnxruntime
    backend, 1 otherwise. (With GPUs Triton picks KIND_GPU, count 1 per GPU, `gpus` all of them.)
    """
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        group.name = group.name or f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = default_instance_count(config, group.kind)


def _check_platform(config: mc.ModelConfig) -> None:
    """Triton core's AutoCompleteBackendFields (run whether or not auto-complete is on): the
    backend, platform and model file name follow from each other. A config naming neither is an
    ONNX model: the loader only gets here for one after loading its `model.onnx`."""
    _check_backend(config)
    if not config.default_model_filename and config.backend in _DEFAULT_FILENAMES:
        config.default_model_filename = _DEFAULT_FILENAMES[config.backend]


def _check_backend(config: mc.ModelConfig) -> None:
    if not config.platform and not config.backend:
        config.platform, config.backend = ONNX_PLATFORM, ONNX_BACKEND
        return
    if config.backend == PYTHON_BACKEND and not config.platform:
        return
    backend_for = _SUPPORTED.get(config.platform) if config.platform else None
    unknown_platform = bool(config.platform) and backend_for is None
    unknown_backend = config.backend not in ("", *_SUPPORTED.values())
    mismatched = backend_for is not None and config.backend not in ("", backend_for)
    if unknown_platform or unknown_backend or mismatched:
        raise ModelConfigError(
            f"model '{config.name}': platform '{config.platform}' backend '{config.backend}' "
            "is not supported (supported: platform 'onnxruntime_onnx' with backend "
            "'onnxruntime', platform 'tensorrt_plan' with backend 'tensorrt', backend 'python' "
            "without a platform)"
        )
    if TENSORRT_PLATFORM in (config.platform,) or config.backend == TENSORRT_BACKEND:
        config.platform, config.backend = TENSORRT_PLATFORM, TENSORRT_BACKEND
        return
    config.platform = config.platform or ONNX_PLATFORM
    config.backend = config.backend or ONNX_BACKEND


def _model_can_batch(inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor]) -> bool:
    return all(t.shape and t.shape[0] is None for t in (*inputs, *outputs))


def _complete_tensors(
    config: mc.ModelConfig,
    declared: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput],
    model: Sequence[ModelTensor],
    kind: str,
    auto_complete: bool,
    *,
    require_all: bool,
) -> None:
    by_name = {t.name: t for t in model}
    batch = config.max_batch_size > 0
    seen = set()
    for cfg in declared:
        tensor = by_name.get(cfg.name)
        if tensor is None:
            raise ModelConfigError(
                f"model '{config.name}': config {kind} '{cfg.name}' is not an {kind} of the model "
                f"(model {kind}s: {', '.join(sorted(by_name)) or 'none'})"
            )
        seen.add(cfg.name)
        _complete_one(config.name, cfg, tensor, kind, batch, auto_complete)
    missing = [t for t in model if t.name not in seen]
    if not missing or (declared and not require_all):
        return
    if not auto_complete:
        # The ONNX Runtime backend's count check, in its words (`ValidateInputs`); Triton has no
        # output count check, but a model served without outputs answers nothing.
        raise ModelConfigError(
            f"unable to load model '{config.name}', configuration expects {len(declared)} "
            f"{kind}s, model provides {len(model)} (auto-complete is off: list "
            f"{', '.join(repr(t.name) for t in missing)})"
        )
    for tensor in missing:
        cfg = config.input.add() if kind == "input" else config.output.add()
        cfg.name = tensor.name
        _complete_one(config.name, cfg, tensor, kind, batch, auto_complete=True)


def _complete_one(
    model_name: str,
    cfg: mc.ModelInput | mc.ModelOutput,
    tensor: ModelTensor,
    kind: str,
    batch: bool,
    auto_complete: bool,
) -> None:
    where = f"model '{model_name}' {kind} '{tensor.name}'"
    if tensor.datatype is None:
        raise ModelConfigError(f"{where}: the model's type {tensor.type_name} is not supported")
    model_type = mc.DataType.Value(tensor.datatype.config)
    if cfg.data_type == mc.TYPE_INVALID:
        if not auto_complete:  # Triton core ValidateIOShape (with or without auto-complete)
            raise ModelConfigError(
                f"model {kind} '{tensor.name}' must specify 'data_type' for {model_name}"
            )
        cfg.data_type = model_type  # type: ignore[assignment]
    elif cfg.data_type != model_type:
        raise ModelConfigError(
            f"{where}: config says {mc.DataType.Name(cfg.data_type)} but the model has "
            f"{tensor.datatype.config}"
        )
    model_dims = list(tensor.shape[1:] if batch else tensor.shape)
    has_reshape = cfg.HasField("reshape")
    if not cfg.dims and not has_reshape:
        if not auto_complete:
            raise ModelConfigError(
                f"model {kind} '{tensor.name}' must specify 'dims' for {model_name}"
            )
        cfg.dims.extend(-1 if d is None else d for d in model_dims)
        if not cfg.dims:
            # onnxruntime_backend AutoCompleteIO: no dimension left (a scalar, or only the batch
            # dimension) reads as dims [1]; when batching, reshaped to nothing (an empty reshape
            # without batching is not a valid config).
            cfg.dims.append(1)
            if batch:
                cfg.reshape.SetInParent()
        return
    fixed = has_reshape and -1 not in cfg.dims and -1 not in cfg.reshape.shape
    if fixed and math.prod(cfg.dims) != math.prod(cfg.reshape.shape):
        raise ModelConfigError(
            f"{where}: dims {list(cfg.dims)} and reshape {list(cfg.reshape.shape)} hold "
            "different numbers of elements"
        )
    checked = list(cfg.reshape.shape) if has_reshape else list(cfg.dims)
    if not tensor.shape:
        # onnxruntime_backend ValidateInputs/ValidateOutputs: a scalar model tensor takes any
        # dims of ones (the backend feeds it rank 0 and reports the config's dims).
        if any(d != 1 for d in checked):
            raise ModelConfigError(
                f"unable to load model '{model_name}', scalar tensor '{tensor.name}', should "
                "only provide 1 in the model configuration when the model doesn't support "
                f"batching. Model configuration provided: {_triton_shape(checked)}."
            )
        return
    if not _dims_compatible(checked, model_dims):
        raise ModelConfigError(_dims_mismatch(model_name, tensor, checked, batch))


def _dims_mismatch(model_name: str, tensor: ModelTensor, dims: Sequence[int], batch: bool) -> str:
    """onnxruntime_backend / tensorrt_backend `CompareDimsSupported`, in their words (the
    reshape, when there is one, stands for the dims)."""
    model = [-1 if d is None else d for d in tensor.shape]
    expects = (
        f"model '{model_name}', tensor '{tensor.name}': the model expects {len(model)} "
        f"dimensions (shape {_triton_shape(model)}) but the model configuration specifies "
    )
    if not batch:
        return f"{expects}{len(dims)} dimensions (shape {_triton_shape(dims)})"
    full = [-1, *dims]
    return (
        f"{expects}{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 "
        f"followed by the explicit tensor shape, making complete shape {_triton_shape(full)})"
    )


def _dims_compatible(config_dims: Sequence[int], model_dims: Sequence[int | None]) -> bool:
    if len(config_dims) != len(model_dims):
        return False
    return all(c == -1 or m is None or c == m for c, m in zip(config_dims, model_dims, strict=True))


def _triton_shape(dims: Sequence[int]) -> str:
    """Triton's ShapeToString: `[1,2]`."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _fmt(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
