"""Device (GPU) memory in the memory budget: what is free on a GPU, and whether a version fits.

The host budget (`agent.models.memory_plan`) counts RSS, which misses what CUDA, TensorRT and
ONNX Runtime's CUDA provider allocate on a discrete GPU. So a version that will run on a GPU is
also checked against the device it runs on, before it is loaded:

    need = 2 * weights  (the version folder's files: the engine or model, its external data)

doubled as in the host estimate (`agent.models.memory_probe`): the weights, plus activations,
workspace and the runtime's own buffers, which are of the same order for the models a device
serves. A version whose need is over the GPU's free memory less a headroom is refused with the
figures, as on the host. Free memory comes from the driver, so versions already loaded (and
other processes) are counted as they are; two loads at once may both see the same free memory.

Where the GPU is integrated (Jetson: `cudaDevAttrIntegrated`), device memory is the host RAM:
there is no separate device budget (`MemoryKind.UNIFIED`), the host budget covers both.

The probe reads NVML (nvidia-ml-py; no CUDA context is created) or, without it, cuda-python's
`cudaMemGetInfo` (which creates the primary context on the device it reads).
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.errors import MemoryBudgetError
from agent.proto import model_config_pb2 as mc

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_HEADROOM",
    "CudaDeviceMemory",
    "DeviceMemory",
    "DeviceMemoryProbe",
    "MemoryKind",
    "NvmlDeviceMemory",
    "check_device_fit",
    "detect_device_memory",
    "device_need_bytes",
    "folder_bytes",
    "gpu_device",
]

DEFAULT_HEADROOM = 0.1  # of the GPU's total memory kept free (other clients, fragmentation)
_MIB = 1 << 20


class MemoryKind(enum.Enum):
    """Where a device's memory is: its own (discrete GPU) or the host's (integrated, Jetson)."""

    DISCRETE = "discrete"
    UNIFIED = "unified"


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One GPU's memory as the driver reports it, in bytes."""

    device_id: int
    total_bytes: int
    free_bytes: int


class DeviceMemoryProbe(Protocol):
    """Reads a GPU's memory; None when it cannot (no such device, driver error)."""

    kind: MemoryKind

    def read(self, device_id: int) -> DeviceMemory | None: ...


def device_need_bytes(weights_bytes: int) -> int:
    """The device memory a version is taken to need before it is loaded (module docstring)."""
    return 2 * max(0, weights_bytes)


def gpu_device(config: mc.ModelConfig, *, tensorrt: bool) -> int | None:
    """The GPU a version's first instance runs on, or None when it runs on the CPU.

    TensorRT engines always run on a GPU; ONNX Runtime models do with a KIND_GPU instance group
    or a GPU execution accelerator (`agent.backends.onnx.choose_providers`). The device is the
    group's first `gpus` entry, else GPU 0.
    """
    gpu_kind = mc.ModelInstanceGroup.KIND_GPU
    groups = list(config.instance_group)
    on_gpu = (
        tensorrt
        or any(g.kind == gpu_kind for g in groups)
        or bool(config.optimization.execution_accelerators.gpu_execution_accelerator)
    )
    if not on_gpu:
        return None
    for group in groups:
        if group.kind == gpu_kind and group.gpus:
            return int(group.gpus[0])
    return 0


def folder_bytes(folder: Path) -> int:
    """The size of a version folder's files (its weights), unreadable ones left out."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def check_device_fit(
    need_bytes: int,
    memory: DeviceMemory,
    *,
    model: str,
    version: int | str,
    headroom: float = DEFAULT_HEADROOM,
) -> None:
    """Refuse a version whose device need is over the GPU's free memory less the headroom.

    Args:
        need_bytes: what the version is taken to need (`device_need_bytes`).
        memory: the GPU's memory now.
        model: the model's name, for the message.
        version: the version, for the message.
        headroom: share of the GPU's total memory kept free, in [0, 1).

    Raises:
        ValueError: a headroom outside [0, 1).
        MemoryBudgetError: the version does not fit, with the figures.
    """
    if not 0 <= headroom < 1:
        raise ValueError(f"device memory headroom must be in [0, 1), got {headroom}")
    kept = int(memory.total_bytes * headroom)
    usable = max(0, memory.free_bytes - kept)
    if need_bytes > usable:
        raise MemoryBudgetError(
            f"model '{model}' version {version} needs {_mib(need_bytes)} of GPU "
            f"{memory.device_id} memory, {_mib(usable)} usable: {_mib(memory.free_bytes)} free "
            f"of {_mib(memory.total_bytes)}, {_mib(kept)} kept free"
        )


class NvmlDeviceMemory:
    """`DeviceMemoryProbe` over NVML (nvidia-ml-py); NVML's device index is CUDA's by default."""

    kind = MemoryKind.DISCRETE

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def read(self, device_id: int) -> DeviceMemory | None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(device_id)
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._nvml.NVMLError as exc:
            logger.debug("NVML memory of GPU %d: %s", device_id, exc)
            return None
        return DeviceMemory(device_id, int(info.total), int(info.free))


class CudaDeviceMemory:
    """`DeviceMemoryProbe` over cuda-python's `cudaMemGetInfo` on the given device."""

    def __init__(self, runtime: Any, kind: MemoryKind) -> None:
        self._rt = runtime
        self.kind = kind

    def read(self, device_id: int) -> DeviceMemory | None:
        rt = self._rt
        (err,) = rt.cudaSetDevice(device_id)
        if int(err) != 0:
            return None
        err, free, total = rt.cudaMemGetInfo()
        if int(err) != 0:
            return None
        return DeviceMemory(device_id, int(total), int(free))


def detect_device_memory() -> tuple[DeviceMemoryProbe | None, str]:
    """The probe for this host's GPUs, or (None, why): no GPU, or device memory is host memory.

    An integrated GPU (Jetson) gives a UNIFIED probe: its memory is the host's, so loads are
    not checked against it (the host budget covers it).
    """
    try:
        rt = importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        try:
            rt = importlib.import_module("cuda.cudart")
        except ImportError as exc:
            return None, f"cuda-python is not installed ({exc})"
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0 or not count:
        return None, f"no CUDA device ({err})"
    err, integrated = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrIntegrated, 0)
    if int(err) == 0 and integrated:
        return CudaDeviceMemory(rt, MemoryKind.UNIFIED), "integrated GPU: device memory is RAM"
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError: fall back to CUDA
        logger.debug("NVML unavailable for device memory (%s); using cudaMemGetInfo", exc)
        return CudaDeviceMemory(rt, MemoryKind.DISCRETE), f"cudaMemGetInfo, {count} GPU(s)"
    return NvmlDeviceMemory(nvml), f"NVML, {count} GPU(s)"


def _mib(nbytes: int) -> str:
    if 0 < nbytes < _MIB:  # a small model's need is not "0 MiB"
        return f"{nbytes / 1024:.1f}".removesuffix(".0") + " KiB"
    return f"{nbytes / _MIB:.1f}".removesuffix(".0") + " MiB"
