"""Read what this device has, as a plain JSON-able dict (`device_facts`).

Every probe is bounded and never raises: a missing file, library or command is a fact (None or
absent), not an error. The same dict serves `edge-agent doctor` and the fleet's inventory.
Importing onnxruntime or tensorrt here is deliberate and late: they are what is being asked about.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import psutil

from agent.device.gpu import GpuReader
from agent.device.tegra import parse_nv_tegra_release

NV_TEGRA_RELEASE = Path("/etc/nv_tegra_release")
CUDA_VERSION_JSON = Path("/usr/local/cuda/version.json")
# Distributions that each install the `onnxruntime` package: two at once overwrite each other.
ONNXRUNTIME_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
    "onnxruntime-training",
)


def device_facts(
    *,
    tegra_release: Path = NV_TEGRA_RELEASE,
    cuda_version_json: Path = CUDA_VERSION_JSON,
    gpu_reader: GpuReader | None = None,
) -> dict[str, Any]:
    """This device's facts: platform, jetson, cpu, memory, gpu, cuda, tensorrt, onnxruntime.

    Args:
        tegra_release: the Jetson release file (absent: not a Jetson).
        cuda_version_json: the CUDA toolkit's version file.
        gpu_reader: reads the GPUs (`agent.device.gpu.detect_gpu_reader`); None: none found.
    """
    return {
        "platform": {
            "machine": platform.machine(),
            "system": platform.system(),
            "python": platform.python_version(),
            "executable": sys.executable,
            "virtualenv": sys.prefix != sys.base_prefix,
        },
        "jetson": jetson_facts(tegra_release),
        "cpu": {"count": os.cpu_count() or 0, "model": _cpu_model()},
        "memory": {"total_bytes": int(psutil.virtual_memory().total)},
        "gpu": _read_gpus(gpu_reader),
        "cuda": cuda_facts(cuda_version_json),
        "tensorrt": tensorrt_facts(),
        "onnxruntime": onnxruntime_facts(),
    }


def jetson_facts(path: Path) -> dict[str, Any] | None:
    """The L4T/JetPack release in `path`; None where the file is absent (not a Jetson)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    release = parse_nv_tegra_release(text)
    if release is None:
        return {"release_file": str(path), "l4t": None, "raw": text.strip()[:200]}
    return {
        "release_file": str(path),
        "l4t": release.l4t,
        "jetpack": release.jetpack,
        "board": release.board,
        "supported": release.supported,
        "unsupported_reason": release.unsupported_reason(),
    }


def cuda_facts(version_json: Path) -> dict[str, Any]:
    """The CUDA toolkit (version.json) and driver (libcuda's cuDriverGetVersion) versions."""
    toolkit = None
    try:
        doc = json.loads(version_json.read_text())
        toolkit = str(doc["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    driver = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
            driver = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return {"toolkit": toolkit, "driver": driver}


def tensorrt_facts() -> dict[str, Any]:
    """TensorRT's Python bindings: version and where they come from; version None if absent."""
    try:
        module = importlib.import_module("tensorrt")
    except Exception as exc:  # noqa: BLE001 - a broken install is a fact to report
        return {"version": None, "error": _why(exc)}
    return {"version": str(getattr(module, "__version__", "?")), "path": _where(module)}


def onnxruntime_facts() -> dict[str, Any]:
    """ONNX Runtime: version, execution providers, and every distribution that installs it."""
    distributions = installed_onnxruntime_distributions()
    try:
        ort = importlib.import_module("onnxruntime")
        providers = [str(p) for p in ort.get_available_providers()]
    except Exception as exc:  # noqa: BLE001 - a broken install is a fact to report
        return {"version": None, "error": _why(exc), "distributions": distributions}
    return {
        "version": str(getattr(ort, "__version__", "?")),
        "providers": providers,
        "distributions": distributions,
        "path": _where(ort),
    }


def installed_onnxruntime_distributions() -> list[str]:
    """`name==version` of each installed distribution that provides `onnxruntime`."""
    found = []
    for name in ONNXRUNTIME_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def onnxruntime_import_error() -> str | None:
    """Why `import onnxruntime` fails; None when it works."""
    try:
        importlib.import_module("onnxruntime")
    except Exception as exc:  # noqa: BLE001 - any failure to import is the answer
        return _why(exc)
    return None


def _read_gpus(reader: GpuReader | None) -> list[dict[str, Any]] | None:
    """One entry per GPU (`GpuReading.to_json`: name, memory, load ...); None: no reader."""
    if reader is None:
        return None
    try:
        return [reading.to_json() for reading in reader.read()]
    except Exception:  # noqa: BLE001 - a probe that breaks reads as "no GPU figures"
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _where(module: object) -> str:
    return str(Path(getattr(module, "__file__", "") or "?").parent)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
