"""Complete a model config from the model file, and refuse configs that contradict it.

The result is what Triton reports for the same model and config on a CPU-only device, in three
steps as Triton takes them:

- Server side, always (core `AutoCompleteBackendFields`): `name`, and `backend`, `platform` and
  `default_model_filename` from each other (`model.onnx`, `model.plan`, `model.py`).
- Backend side, unless auto-complete is off (`--disable-auto-complete-config`, onnxruntime_backend
  `AutoCompleteConfig`), and only while the config lists no inputs or no outputs: a batchable
  model gets `max_batch_size` 4 (the server's `default-max-batch-size`) when it has none, and
  an empty `dynamic_batching` when max_batch_size > 1 and no scheduler is set; a missing input or
  output list is filled from the model (a tensor that is only the batch dimension becomes
  `dims: [1]` with an empty `reshape`). Beyond Triton, missing data types and dims of listed tensors
  are filled too, and a batchable model whose config lists inputs and outputs without the batch
  dimension still gets max_batch_size 4 (Triton would refuse that config).
- Normalisation, always (core `NormalizeModelConfig`, `NormalizeInstanceGroup`): the version
  policy, `preferred_batch_size: [max_batch_size]` for a `dynamic_batching` that has none,
  pinned-memory optimization flags, and instance groups (see `_fill_instance_groups`).

With auto-complete off a gap in inputs or outputs is an error. In both modes a config that
disagrees with the model (data type, rank, fixed dimension) is refused with a message naming both
sides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import default_instance_count
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
    """Return a completed copy of `config` for an ONNX model.

    Raises:
        ModelConfigError: the config contradicts the model, names a platform this backend does not
            run, or (without auto-complete) leaves out what the model needs.
    """
    out = mc.ModelConfig()
    out.CopyFrom(config)
    if not out.name:
        out.name = model_name
    elif out.name != model_name:
        raise ModelConfigError(
            f"config name '{out.name}' does not match the model directory '{model_name}'"
        )
    _check_platform(out)
    batching = _model_can_batch(inputs, outputs)
    if out.max_batch_size < 0:
        raise ModelConfigError(f"model '{model_name}': max_batch_size must be >= 0")
    # onnxruntime_backend's AutoCompleteConfig returns early when inputs and outputs are listed.
    backend_step = auto_complete and (not out.input or not out.output)
    filled = (
        out.max_batch_size == 0
        and auto_complete
        and batching
        and not _config_has_full_rank(out, inputs)
    )
    if filled:
        out.max_batch_size = DEFAULT_MAX_BATCH_SIZE
    if (
        (backend_step or filled)
        and batching
        and out.backend == ONNX_BACKEND
        and out.max_batch_size > 1
        and out.WhichOneof("scheduling_choice") is None
    ):
        out.dynamic_batching.SetInParent()  # AutoCompleteMaxBatch: turn the batcher on
    if out.max_batch_size > 0 and not batching:
        fixed = next(t for t in (*inputs, *outputs) if not t.shape or t.shape[0] is not None)
        raise ModelConfigError(
            f"model '{model_name}': config max_batch_size is {out.max_batch_size} but the model's "
            f"'{fixed.name}' has no dynamic batch dimension (shape {_fmt(fixed.shape)})"
        )
    # Control and state inputs are fed by the sequence batcher, never listed as inputs.
    fed = {c.name for c in out.sequence_batching.control_input}
    fed.update(s.input_name for s in out.sequence_batching.state)
    outputs = [
        t for t in outputs if t.name not in {s.output_name for s in out.sequence_batching.state}
    ]
    inputs = [t for t in inputs if t.name not in fed]
    _complete_tensors(out, out.input, inputs, "input", auto_complete, require_all=True)
    _complete_tensors(out, out.output, outputs, "output", auto_complete, require_all=False)
    _fill_defaults(out)
    return out


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


def _config_has_full_rank(config: mc.ModelConfig, inputs: Sequence[ModelTensor]) -> bool:
    """True when the config's input dims already include the batch dimension."""
    by_name = {t.name: t for t in inputs}
    for cfg in config.input:
        model = by_name.get(cfg.name)
        dims = cfg.reshape.shape if cfg.HasField("reshape") else cfg.dims
        if model is not None and dims and len(dims) == len(model.shape):
            return True
    return False


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
    if not declared or require_all:
        if missing and not auto_complete:
            raise ModelConfigError(
                f"model '{config.name}': config has no {kind} '{missing[0].name}' that the model "
                "declares (auto-complete is off)"
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
        if not auto_complete:
            raise ModelConfigError(f"{where}: config sets no data_type (auto-complete is off)")
        cfg.data_type = model_type  # type: ignore[assignment]
    elif cfg.data_type != model_type:
        raise ModelConfigError(
            f"{where}: config says {mc.DataType.Name(cfg.data_type)} but the model has "
            f"{tensor.datatype.config}"
        )
    model_dims = list(tensor.shape[1:] if batch else tensor.shape)
    has_reshape = cfg.HasField("reshape")
    if not cfg.dims and not has_reshape:
        if not auto_complete and model_dims:
            raise ModelConfigError(f"{where}: config sets no dims (auto-complete is off)")
        cfg.dims.extend(-1 if d is None else d for d in model_dims)
        if not cfg.dims and batch:
            # onnxruntime_backend AutoCompleteIO: a tensor of only the batch dimension reads as
            # [1] reshaped to nothing. (Triton gives an unbatched scalar dims [1] as well; here
            # it keeps no dims, which is what the runtime feeds a scalar.)
            cfg.dims.append(1)
            cfg.reshape.SetInParent()
        return
    fixed = has_reshape and -1 not in cfg.dims and -1 not in cfg.reshape.shape
    if fixed and math.prod(cfg.dims) != math.prod(cfg.reshape.shape):
        raise ModelConfigError(
            f"{where}: dims {list(cfg.dims)} and reshape {list(cfg.reshape.shape)} hold "
            "different numbers of elements"
        )
    checked = list(cfg.reshape.shape) if has_reshape else list(cfg.dims)
    label = "reshape" if has_reshape else "dims"
    if not _dims_compatible(checked, model_dims):
        raise ModelConfigError(
            f"{where}: config {label} {checked} do not match the model's shape "
            f"{_fmt(tensor.shape)}{' (batch dimension excluded)' if batch else ''}"
        )


def _dims_compatible(config_dims: Sequence[int], model_dims: Sequence[int | None]) -> bool:
    if len(config_dims) != len(model_dims):
        return False
    return all(c == -1 or m is None or c == m for c, m in zip(config_dims, model_dims, strict=True))


def _fmt(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
