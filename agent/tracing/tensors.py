"""Triton's `TENSORS` trace level: a tensor as one trace JSON entry.

An entry is `{"id": N, "activity": A, "tensor": {"name", "data", "shape", "dtype"}}` with every
value a string, as Triton's tracer writes it: `data` the elements in row-major order joined by
commas (numbers as C++ streams print them: `%g`, booleans as 1/0, BYTES elements each in double
quotes), `shape` the dimensions joined by commas. Activities: `TENSOR_QUEUE_INPUT` (the request's
inputs as the model's queue receives them), `TENSOR_BACKEND_INPUT` (the inputs as the backend
gets them, after the model's reshape) and `TENSOR_BACKEND_OUTPUT` (the outputs the backend
returned). FP16/BF16 values are written too (Triton leaves their `data` empty).
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
BACKEND_INPUT = "TENSOR_BACKEND_INPUT"
BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"


def tensor_entry(name: str, datatype: str, data: np.ndarray) -> dict[str, str]:
    """The `tensor` object of one entry."""
    return {
        "name": name,
        "data": _data(datatype, data),
        "shape": ",".join(str(int(d)) for d in data.shape),
        "dtype": datatype,
    }


def _data(datatype: str, data: np.ndarray) -> str:
    values: list[Any] = np.asarray(data).ravel().tolist()
    if datatype == "BYTES":
        return ",".join(f'"{_text(v)}"' for v in values)
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in values)
    if datatype.startswith(("FP", "BF")):
        return ",".join(format(float(v), "g") for v in values)
    return ",".join(str(int(v)) for v in values)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
