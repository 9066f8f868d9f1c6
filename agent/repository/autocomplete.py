"""Complete a model config from the model file, and refuse configs that contradict it.

Triton's `--strict-model-config=false` behaviour: a missing config.pbtxt, missing inputs/outputs,
data types, dims or max_batch_size are filled from what the model declares. With strict config
(or `--disable-auto-complete-config`) nothing is filled and a gap is an error. In both modes a
config that disagrees with the model (data type, rank, fixed dimension) is refused with a message
naming both sides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.tensors.datatypes import ModelTensor

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_BACKEND = "tensorrt"
PYTHON_BACKEND = "python"  # Triton's Python backend has no platform
_SUPPORTED = {ONNX_PLATFORM: ONNX_BACKEND, TENSORRT_PLATFORM: TENSORRT_BACKEND}
DEFAULT_MAX_BATCH_SIZE = 4  # what Triton's ONNX Runtime backend picks when it can batch


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
    _check_platform(out, auto_complete)
    batching = _model_can_batch(inputs, outputs)
    if out.max_batch_size < 0:
        raise ModelConfigError(f"model '{model_name}': max_batch_size must be >= 0")
    if (
        out.max_batch_size == 0
        and auto_complete
        and batching
        and not _config_has_full_rank(out, inputs)
    ):
        out.max_batch_size = DEFAULT_MAX_BATCH_SIZE
    if out.max_batch_size > 0 and not batching:
        fixed = next(t for t in (*inputs, *outputs) if not t.shape or t.shape[0] is not None)
        raise ModelConfigError(
            f"model '{model_name}': config max_batch_size is {out.max_batch_size} but the model's "
            f"'{fixed.name}' has no dynamic batch dimension (shape {_fmt(fixed.shape)})"
        )
    _complete_tensors(out, out.input, inputs, "input", auto_complete, require_all=True)
    _complete_tensors(out, out.output, outputs, "output", auto_complete, require_all=False)
    _fill_defaults(out)
    return out


def _fill_defaults(config: mc.ModelConfig) -> None:
    """Defaults Triton writes into every config it reports (not subject to strict mode)."""
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    if not config.instance_group:
        config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for index, group in enumerate(config.instance_group):
        group.name = group.name or f"{config.name}_{index}"
        group.count = group.count or 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_CPU


def _check_platform(config: mc.ModelConfig, auto_complete: bool) -> None:
    if not config.platform and not config.backend:
        if not auto_complete:
            raise ModelConfigError(f"model '{config.name}': config must set platform or backend")
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
