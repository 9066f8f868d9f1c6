"""Which backend runs a model version, from a closed set chosen by its config.

* `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"` → `OnnxBackend` (ONNX Runtime). A
  `tensorrt` GPU accelerator in the config turns on ONNX Runtime's TensorRT provider with the
  options `ort_tensorrt_options` derives from the same fields the engine builder reads, with its
  engine cache inside the model cache.
* `platform: "tensorrt_plan"` / `backend: "tensorrt"` → `TensorRTBackend`. The version folder
  holds `model.plan`, or only `model.onnx`: then the engine is built on the device on first load and
  cached (`agent.backends.tensorrt.build.cached_engine`), so later loads, restarts and swaps reuse
  it.
* `backend: "python"` → `PythonBackend`: `model.py` run in one worker process per instance. A
  config naming no platform and no backend whose version folder holds `model.py` (and no
  `model.onnx` / `model.plan`) is a Python model too, as in Triton.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from agent.backends.base import Backend, HoldsWorkerMemory
from agent.backends.health import HealthListener, RestartPolicy
from agent.backends.python.custom_metrics import CustomMetricStore
from agent.backends.tensorrt.build import cached_engine, spec_from_config
from agent.errors import ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.repository.layout import holds_python_model

if TYPE_CHECKING:
    from agent.backends.python.bls import BlsRunner

TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_BACKEND = "tensorrt"
PLAN_FILENAME = "model.plan"
ONNX_FILENAME = "model.onnx"
PYTHON_BACKEND = "python"


class BackendKind(Enum):
    """The backends the agent can run."""

    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    PYTHON = "python"


def backend_kind(config: mc.ModelConfig, version_dir: Path | None = None) -> BackendKind:
    """The backend a config asks for (ONNX Runtime unless it names TensorRT or Python).

    With `version_dir`, a config naming neither platform nor backend is a Python model when the
    folder holds `model.py` (Triton's rule, `layout.holds_python_model`).
    """
    if config.backend == PYTHON_BACKEND:
        return BackendKind.PYTHON
    if version_dir is not None and holds_python_model(version_dir, config):
        return BackendKind.PYTHON
    if config.platform == TENSORRT_PLATFORM or config.backend == TENSORRT_BACKEND:
        return BackendKind.TENSORRT
    return BackendKind.ONNXRUNTIME


def engine_path(version_dir: Path, config: mc.ModelConfig, cache_root: Path | None) -> Path:
    """The engine to load: the version's own `.plan`, or one built from its ONNX and cached.

    Raises:
        ModelLoadError: neither file is there, no cache root to build into, or the build failed.
    """
    plan = version_dir / (config.default_model_filename or PLAN_FILENAME)
    if plan.is_file():
        return plan
    onnx_path = version_dir / ONNX_FILENAME
    if not onnx_path.is_file():
        raise ModelLoadError(f"{version_dir} holds neither {plan.name} nor {ONNX_FILENAME}")
    if cache_root is None:
        raise ModelLoadError(f"{version_dir}: building an engine needs a model cache directory")
    return cached_engine(onnx_path, cache_root, spec_from_config(config))


def create_backend(
    version_dir: Path,
    config: mc.ModelConfig,
    intra_op_threads: int,
    *,
    cache_root: Path | None = None,
    model_name: str = "",
    version: int = 0,
    auto_complete: bool = True,
    custom_metrics: CustomMetricStore | None = None,
    bls: BlsRunner | None = None,
    restart_policy: RestartPolicy | None = None,
    health_listener: HealthListener | None = None,
    allow_cpu_fallback: bool = False,
    lone_intra_op_threads: int = 0,
) -> Backend:
    """The backend instance for one model version (blocking: may build an engine).

    `auto_complete` off: a Python model's `auto_complete_config` is not run, nor is a TensorRT
    config completed from its engine (Triton's `--disable-auto-complete-config`).
    `custom_metrics`: where a Python model's `pb_utils.MetricFamily` values go (None: nowhere).
    `bls` runs a Python model's BLS requests (the data plane).
    `restart_policy` and `health_listener`: how failed instances are restarted, and who hears
    of it (`agent.backends.health`). `allow_cpu_fallback`: an ONNX model whose config asks for
    an accelerator this ONNX Runtime lacks runs on the CPU instead of being refused.
    `lone_intra_op_threads`: an ONNX model's threads for a run that starts alone
    (`agent.backends.onnx.ThreadPlan`; 0: as `intra_op_threads`).

    Raises:
        ModelLoadError: the runtime is missing (TensorRT on a CPU-only host: the model is then
            UNAVAILABLE with that reason), the file is missing or refused.
    """
    kind = backend_kind(config, version_dir)
    # Each runtime is imported when a model first needs it (not to dodge a cycle): a device that
    # serves only Python models never loads onnxruntime, and TensorRT exists on GPU hosts only.
    if kind is BackendKind.PYTHON:
        from agent.backends.python.backend import PythonBackend  # noqa: PLC0415

        return PythonBackend(
            version_dir,
            config,
            model_name=model_name,
            version=version,
            auto_complete=auto_complete,
            custom_metrics=custom_metrics,
            bls=bls,
            restart_policy=restart_policy,
            health_listener=health_listener,
        )
    if kind is BackendKind.TENSORRT:
        from agent.backends.tensorrt.backend import TensorRTBackend  # noqa: PLC0415 - GPU hosts only

        return TensorRTBackend(
            engine_path(version_dir, config, cache_root),
            config,
            model_name=model_name,
            auto_complete=auto_complete,
            restart_policy=restart_policy,
            health_listener=health_listener,
        )
    from agent.backends.onnx import OnnxBackend  # noqa: PLC0415

    return OnnxBackend(
        version_dir / (config.default_model_filename or ONNX_FILENAME),
        config,
        intra_op_threads,
        cache_root,
        allow_cpu_fallback=allow_cpu_fallback,
        restart_policy=restart_policy,
        health_listener=health_listener,
        lone_intra_op_threads=lone_intra_op_threads,
    )


def worker_memory_bytes(backend: Backend) -> int:
    """Resident memory of a backend's worker processes (Python models; 0 for the others).

    The agent's own RSS does not show it, so the registry reserves it in the memory budget.
    """
    return backend.worker_rss_bytes if isinstance(backend, HoldsWorkerMemory) else 0
