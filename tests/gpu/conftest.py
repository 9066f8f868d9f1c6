"""GPU checks: each part skips, with the reason printed, where what it needs is missing.

* TensorRT tests need the `tensorrt` package and a CUDA device.
* CUDA shared-memory tests need cuda-python (`cuda.bindings`) and a CUDA device.
* NVML tests need nvidia-ml-py (`pynvml`) and a driver that sees a GPU.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def _cuda_reason() -> str | None:
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return f"cuda-python cannot be imported ({exc})"
    err, count = runtime.cudaGetDeviceCount()
    if int(err) != 0 or count == 0:
        return f"no CUDA device ({err})"
    return None


def _tensorrt_reason() -> str | None:
    try:
        importlib.import_module("tensorrt")
    except ImportError as exc:
        return f"tensorrt cannot be imported ({exc})"
    return _cuda_reason()


def _nvml_reason() -> str | None:
    from agent.device.gpu import NvmlReader

    reader, why = NvmlReader.open()
    return None if reader is not None else why


REASONS = {"cuda": _cuda_reason(), "tensorrt": _tensorrt_reason(), "nvml": _nvml_reason()}


def pytest_configure(config: pytest.Config) -> None:
    for part in REASONS:
        config.addinivalue_line("markers", f"needs_{part}: skipped without {part}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for part, reason in REASONS.items():
        if reason is not None and item.get_closest_marker(f"needs_{part}") is not None:
            print(f"GPU check skipped ({part}): {reason}")
            pytest.skip(f"{part}: {reason}")


def pytest_report_header() -> list[str]:
    return [f"gpu {part}: {reason or 'available'}" for part, reason in REASONS.items()]


def trt_module() -> Any:
    return importlib.import_module("tensorrt")
