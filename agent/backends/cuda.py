"""cuda-python's runtime, imported on first use (TensorRT engines and their builder share it)."""

from __future__ import annotations

from typing import Any

from agent.errors import BackendError, ModelLoadError


def cuda_runtime() -> Any:
    """cuda-python's runtime module (`cuda.bindings.runtime`, or `cuda.cudart` before 12.6).

    Raises:
        ModelLoadError: cuda-python is not installed.
    """
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[import-not-found]  # noqa: PLC0415
        except ImportError as exc:
            raise ModelLoadError(
                f"TensorRT is not installed on this device: cuda-python missing ({exc})"
            ) from None
    return runtime


def cuda_check(result: Any, what: str) -> Any:
    """Unpack a cuda-python `(error, *values)` tuple; raise on an error code.

    Raises:
        BackendError: the call failed.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise BackendError(f"CUDA {what} failed: {err}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
