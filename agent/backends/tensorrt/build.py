"""On-device TensorRT engine builds from ONNX, cached so a restart or a swap never rebuilds.

An engine is only valid for the TensorRT version and GPU it was built on, so the cache key is a
hash of: the ONNX file's sha256 (the signed model, byte for byte), the TensorRT version, the GPU's
compute capability, the precision and the build settings that change the engine (workspace, max
batch). Engines live at `CACHE_ROOT/engines/<key>.plan`, written atomically (temp file, fsync,
rename) under a per-key lock, so two loaders never build the same engine twice and a power cut
never leaves half an engine under a final name. A different GPU or TensorRT version gets a
different key and builds its own engine: a wrong engine is never looked up, let alone loaded.

    edge-agent build-engine MODEL_DIR [--version N] [--precision fp16|int8|fp32] ...

INT8 builds use the QDQ model from `edge-agent quantize` (explicit quantization): the scales are
in the graph, so no calibrator runs on the device (implicit INT8 calibration, `int8_calibrator`,
is deprecated since TensorRT 10.1 and removed in 11).

Precision, by TensorRT version (docs/tensorrt.md):

* TensorRT 10.x (JetPack 6 and 7, x86 hosts): FP16 sets `BuilderFlag.FP16`; INT8 sets
  `BuilderFlag.INT8` and `FP16` on the QDQ model, so the layers without Q/DQ run in half
  precision (weak typing: deprecated in late 10.x, still the faster engine there).
* TensorRT 11 removed the weak-typing flags: every network is strongly typed, each layer runs in
  the type the model gives it. INT8 (QDQ) and FP32 build as they are; FP16 is refused with what
  to do (convert the model to FP16 first, then build it as fp32).
The flags are found by name, so the choice follows the installed TensorRT, not its version
string.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from agent.backends.cuda import cuda_check, cuda_runtime
from agent.backends.tensorrt.api import IBuilderConfig, TensorRT
from agent.errors import ModelLoadError
from agent.proto import model_config_pb2 as mc
from model_cache.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

ENGINES_DIR = "engines"
DEFAULT_WORKSPACE_BYTES = 1 << 30
KEY_SCHEMA = "edge-agent.trt-engine/1"


class Precision(Enum):
    """Engine precision; INT8 expects a QDQ model."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the builder is asked for, besides the ONNX file."""

    precision: Precision = Precision.FP16
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    max_batch_size: int = 1  # optimization profile: batch 1..max for dynamic batch dims


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def engine_cache_key(
    onnx_path: Path,
    trt_version: str,
    compute_capability: str,
    precision: Precision | str,
    *,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
    max_batch_size: int = 1,
) -> str:
    """The cache key of an engine: hex sha256 over everything that makes engines differ.

    Args:
        onnx_path: the ONNX model (its bytes are hashed, not its name or path).
        trt_version: `tensorrt.__version__`.
        compute_capability: the GPU's, as "major.minor" (e.g. "8.7" for Orin).
        precision: fp32, fp16 or int8.
        workspace_bytes: builder workspace (changes the tactics TensorRT may pick).
        max_batch_size: the optimization profile's largest batch.

    Returns:
        64 hex digits.
    """
    fields = {
        "schema": KEY_SCHEMA,
        "onnx_sha256": file_sha256(onnx_path),
        "tensorrt": trt_version,
        "compute_capability": compute_capability,
        "precision": Precision(precision).value,
        "workspace_bytes": workspace_bytes,
        "max_batch_size": max_batch_size,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def engine_cache_dir(cache_root: Path) -> Path:
    """Where engines live under the model cache root (next to blobs/ and versions/)."""
    return cache_root / ENGINES_DIR


def import_tensorrt() -> TensorRT:
    """The `tensorrt` module, typed by `agent.backends.tensorrt.api.TensorRT`.

    Raises:
        ModelLoadError: TensorRT is not installed (the model becomes UNAVAILABLE with this text).
    """
    try:
        module: TensorRT = importlib.import_module("tensorrt")  # optional: the `gpu` extra
    except ImportError as exc:
        raise ModelLoadError(f"TensorRT is not installed on this device: {exc}") from None
    return module


def compute_capability(device: int = 0) -> str:
    """The CUDA device's compute capability as "major.minor" (cuda-python runtime API).

    Raises:
        ModelLoadError: cuda-python is missing or no CUDA device answers.
    """

    cudart = cuda_runtime()
    major = cuda_check(
        cudart.cudaDeviceGetAttribute(
            cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device
        ),
        "cudaDeviceGetAttribute",
    )
    minor = cuda_check(
        cudart.cudaDeviceGetAttribute(
            cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device
        ),
        "cudaDeviceGetAttribute",
    )
    return f"{major}.{minor}"


def _builder_flag(trt: TensorRT, name: str) -> Any | None:
    """A `BuilderFlag` member, or None where this TensorRT has removed it (11.x: FP16, INT8)."""
    return getattr(trt.BuilderFlag, name, None)


def _set_precision(trt: TensorRT, config: IBuilderConfig, precision: Precision, onnx: Path) -> None:
    """The builder flags for a precision (see the module docstring)."""
    fp16, int8 = _builder_flag(trt, "FP16"), _builder_flag(trt, "INT8")
    if precision is Precision.FP16:
        if fp16 is None:
            raise ModelLoadError(
                f"TensorRT {trt.__version__} builds strongly typed networks only (no FP16 "
                f"builder flag): convert {onnx} to FP16 first (e.g. NVIDIA ModelOpt AutoCast) "
                "and build it with precision fp32"
            )
        config.set_flag(fp16)
    elif precision is Precision.INT8 and int8 is not None and fp16 is not None:
        # Explicit quantization: Q/DQ nodes carry the scales; FP16 lets the rest run in half.
        config.set_flag(int8)
        config.set_flag(fp16)
    # INT8 without the flags (TensorRT 11) and FP32: the network's own types, strongly typed.


def _network_flags(trt: TensorRT) -> int:
    """`create_network` flags: explicit batch before TensorRT 10 (implied from 10 on)."""
    if int(trt.__version__.split(".")[0]) >= 10:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)


def build_engine(onnx_path: Path, spec: EngineSpec, trt: TensorRT | None = None) -> bytes:
    """Build a serialized engine from an ONNX file with the TensorRT builder.

    Dynamic dimensions get one optimization profile: batch dimension 1..max_batch_size (opt at
    the max); any other dynamic dimension is refused, since the agent cannot pick its range.

    Raises:
        ModelLoadError: TensorRT is missing, the parser refuses the model, the precision is not
            available in this TensorRT, or the build fails.
    """
    trt = trt or import_tensorrt()
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ModelLoadError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_bytes)
    _set_precision(trt, config, spec.precision, onnx_path)
    profile = builder.create_optimization_profile()
    dynamic = False
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(tensor.shape)
        if all(d >= 0 for d in shape):
            continue
        if any(d < 0 for d in shape[1:]) or not shape:
            raise ModelLoadError(
                f"{onnx_path}: input '{tensor.name}' {shape} has a dynamic non-batch dimension"
            )
        rest = shape[1:]
        top = max(1, spec.max_batch_size)
        profile.set_shape(tensor.name, (1, *rest), (top, *rest), (top, *rest))
        dynamic = True
    if dynamic:
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ModelLoadError(f"TensorRT could not build an engine from {onnx_path}")
    return bytes(serialized)


def cached_engine(
    onnx_path: Path,
    cache_root: Path,
    spec: EngineSpec,
    *,
    trt: TensorRT | None = None,
    capability: str | None = None,
) -> Path:
    """The engine for this model on this GPU and TensorRT, built once and then reused.

    Args:
        onnx_path: the ONNX (or INT8 QDQ) model.
        cache_root: the model cache root; engines go in its `engines/` folder.
        spec: precision, workspace, max batch.
        trt: the tensorrt module (tests pass a fake); default: imported.
        capability: the GPU's compute capability; default: asked from CUDA device 0.

    Raises:
        ModelLoadError: TensorRT/CUDA missing or the build failed.
        OSError: the cache folder cannot be written.

    Returns:
        Path of the `.plan` file.
    """
    trt = trt or import_tensorrt()
    capability = capability or compute_capability()
    key = engine_cache_key(
        onnx_path,
        str(trt.__version__),
        capability,
        spec.precision,
        workspace_bytes=spec.workspace_bytes,
        max_batch_size=spec.max_batch_size,
    )
    folder = engine_cache_dir(cache_root)
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / f"{key}.plan"
    if plan.is_file():
        return plan
    fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another loader may be building this very engine
        if plan.is_file():
            return plan
        logger.info(
            "building TensorRT engine for %s (%s, TensorRT %s, sm %s, key %s)",
            onnx_path,
            spec.precision.value,
            trt.__version__,
            capability,
            key[:12],
        )
        atomic_write_bytes(plan, build_engine(onnx_path, spec, trt))
        return plan
    finally:
        os.close(fd)


def spec_from_config(config: mc.ModelConfig) -> EngineSpec:
    """Precision and workspace from the config's `tensorrt` GPU accelerator, batch from the config.

    The same fields ONNX Runtime's TensorRT provider reads (`precision_mode`,
    `max_workspace_size_bytes`), so one config means the same thing to both paths.
    """
    precision, workspace = Precision.FP32, DEFAULT_WORKSPACE_BYTES
    for acc in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if acc.name.lower() != "tensorrt":
            continue
        mode = acc.parameters.get("precision_mode", "FP32").lower()
        if mode in {p.value for p in Precision}:
            precision = Precision(mode)
        size = acc.parameters.get("max_workspace_size_bytes", "")
        if size.isdigit():
            workspace = int(size)
    return EngineSpec(precision, workspace, max(1, config.max_batch_size))


def add_commands(subparsers: Any) -> None:
    """Add `build-engine` to the CLI's subcommands."""
    cmd = subparsers.add_parser("build-engine", help="build (or reuse) a TensorRT engine")
    cmd.add_argument("model_dir", type=Path, help="model folder (config.pbtxt, N/model.onnx)")
    cmd.add_argument("--version", type=int, help="version folder (default: the highest)")
    cmd.add_argument("--precision", choices=[p.value for p in Precision], help="default: config")
    cmd.add_argument("--workspace", type=int, help="builder workspace bytes (default: config)")
    cmd.add_argument("--max-batch", type=int, help="largest batch (default: config)")
    cmd.add_argument("--cache-dir", type=Path, required=True, help="model cache root")


def run(args: argparse.Namespace) -> int:
    """Run `edge-agent build-engine`: prints the engine's path; 2 on any failure."""
    model_dir: Path = args.model_dir
    config = mc.ModelConfig()
    config_file = model_dir / "config.pbtxt"
    try:
        if config_file.is_file():
            text_format.Parse(config_file.read_text(), config)
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
        version = args.version if args.version is not None else (versions or [0])[-1]
        onnx_path = model_dir / str(version) / "model.onnx"
        if not onnx_path.is_file():
            raise ModelLoadError(f"{onnx_path} not found")
        base = spec_from_config(config)
        spec = EngineSpec(
            Precision(args.precision) if args.precision else base.precision,
            args.workspace or base.workspace_bytes,
            args.max_batch or base.max_batch_size,
        )
        plan = cached_engine(onnx_path, args.cache_dir, spec)
    except (ModelLoadError, OSError, text_format.ParseError) as exc:
        print(f"edge-agent build-engine: {exc}", file=sys.stderr)
        return 2
    print(plan)
    return 0


def ort_tensorrt_options(config: mc.ModelConfig, cache_root: Path | None) -> dict[str, Any]:
    """ONNX Runtime TensorRT provider options from the config's `tensorrt` accelerator.

    Precision and workspace come from `precision_mode` / `max_workspace_size_bytes` (as for the
    native engine build). With a cache root, ORT's engine and timing caches go in
    `CACHE_ROOT/engines/ort/MODEL/`, which ORT keys by model, TensorRT version and GPU itself.
    """
    spec = spec_from_config(config)
    options: dict[str, Any] = {
        "trt_fp16_enable": spec.precision.value in ("fp16", "int8"),
        "trt_int8_enable": spec.precision.value == "int8",
        "trt_max_workspace_size": spec.workspace_bytes,
    }
    if cache_root is not None:
        folder = engine_cache_dir(cache_root) / "ort" / (config.name or "model")
        folder.mkdir(parents=True, exist_ok=True)
        options.update(
            trt_engine_cache_enable=True,
            trt_engine_cache_path=str(folder),
            trt_timing_cache_enable=True,
            trt_timing_cache_path=str(folder),
        )
    return options
