"""GPU checks: skipped, with the reason printed, where TensorRT or a CUDA device is missing."""

from __future__ import annotations

from typing import Any

import pytest


def _gpu_or_reason() -> str | None:
    try:
        import tensorrt  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        return f"tensorrt cannot be imported ({exc})"
    try:
        from agent.backends.tensorrt_build import compute_capability

        compute_capability()
    except Exception as exc:
        return f"no CUDA device ({exc})"
    return None


REASON = _gpu_or_reason()


@pytest.fixture(autouse=True, scope="session")
def _require_gpu() -> None:
    if REASON is not None:
        print(f"GPU checks skipped: {REASON}")
        pytest.skip(REASON)


def trt_module() -> Any:
    import tensorrt

    return tensorrt
