"""The GPUs' utilisation and memory: NVML where the NVIDIA driver is, else `tegrastats` (Jetson).

NVML is reached through ctypes (`libnvidia-ml.so.1`), so no extra dependency; on Jetson, whose
GPU shares the RAM, one line of `tegrastats` gives the GPU load and that shared memory.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
from typing import Protocol

from agent.device.tegra import parse_tegrastats

logger = logging.getLogger(__name__)

__all__ = ["GpuProbe", "NvmlProbe", "TegrastatsProbe", "detect_gpu"]


class GpuProbe(Protocol):
    """Reads GPU utilisation and memory; None when it cannot."""

    def read(self) -> list[dict[str, int]] | None: ...


class _Utilization(ctypes.Structure):
    _fields_ = (("gpu", ctypes.c_uint), ("memory", ctypes.c_uint))


class _Memory(ctypes.Structure):
    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class NvmlProbe:
    """NVML through ctypes: utilisation and memory of every GPU."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib

    @classmethod
    def open(cls) -> NvmlProbe | None:
        """Load and initialise NVML; None where there is no NVIDIA driver."""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def read(self) -> list[dict[str, int]] | None:
        """One entry per GPU: index, util_percent, memory_used_bytes, memory_total_bytes."""
        count = ctypes.c_uint()
        if self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            util, mem = _Utilization(), _Memory()
            if (
                self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                or self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0
            ):
                return None
            busy = self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
            entry = {
                "index": index,
                "memory_used_bytes": int(mem.used),
                "memory_total_bytes": int(mem.total),
            }
            if busy:
                entry["util_percent"] = int(util.gpu)
            gpus.append(entry)
        return gpus


class TegrastatsProbe:
    """Jetson: one line of `tegrastats` (GPU load, and the RAM the GPU shares)."""

    def __init__(self, command: str) -> None:
        self._command = command

    @classmethod
    def open(cls) -> TegrastatsProbe | None:
        """None where `tegrastats` is not on the PATH."""
        found = shutil.which("tegrastats")
        return cls(found) if found else None

    def read(self) -> list[dict[str, int]] | None:
        """Run tegrastats until its first line (bounded to 5 s) and parse it."""
        try:
            with subprocess.Popen(
                [self._command, "--interval", "500"], stdout=subprocess.PIPE, text=True
            ) as proc:
                try:
                    line = proc.stdout.readline() if proc.stdout else ""
                finally:
                    proc.kill()
        except OSError as exc:
            logger.debug("tegrastats failed: %s", exc)
            return None
        parsed = parse_tegrastats(line)
        return [parsed] if parsed else None


def detect_gpu() -> GpuProbe | None:
    """NVML, else tegrastats, else None."""
    return NvmlProbe.open() or TegrastatsProbe.open()
