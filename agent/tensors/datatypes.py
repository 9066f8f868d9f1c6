"""Tensor data types: KServe v2 names, Triton config enums, numpy and ONNX element types.

One table keeps the four spellings of a type together so no other module maps them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DataType:
    """One tensor element type in all the spellings the agent meets."""

    kserve: str  # "FP32": KServe v2 protocol datatype
    config: str  # "TYPE_FP32": Triton model config enum name
    numpy: np.dtype  # object dtype for BYTES
    onnx: str  # "tensor(float)": ONNX Runtime type string

    @property
    def itemsize(self) -> int:
        """Bytes per element in the binary tensor format; 0 for variable-length BYTES."""
        return 0 if self.kserve == "BYTES" else self.numpy.itemsize


_TYPES = (
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), "tensor(bool)"),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), "tensor(uint8)"),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), "tensor(uint16)"),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), "tensor(uint32)"),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), "tensor(uint64)"),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), "tensor(int8)"),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), "tensor(int16)"),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), "tensor(int32)"),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), "tensor(int64)"),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), "tensor(float16)"),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), "tensor(float)"),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), "tensor(double)"),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), "tensor(string)"),
)

BY_KSERVE: dict[str, DataType] = {t.kserve: t for t in _TYPES}
BY_CONFIG: dict[str, DataType] = {t.config: t for t in _TYPES}
BY_ONNX: dict[str, DataType] = {t.onnx: t for t in _TYPES}
BY_NUMPY: dict[np.dtype, DataType] = {t.numpy: t for t in _TYPES}


def answered(declared: str, data: np.ndarray) -> str:
    """The KServe datatype an output is answered with: the declared one, or the array's own
    when a model returned another known type (a Python model may; Triton answers the array as
    the model made it, so clients read the values it holds, not bytes reinterpreted)."""
    kind = BY_NUMPY.get(data.dtype)
    return declared if kind is None else kind.kserve


def from_kserve(name: str) -> DataType | None:
    """The type for a KServe datatype string, or None when the agent does not support it."""
    return BY_KSERVE.get(name)


def from_config(name: str) -> DataType | None:
    """The type for a config enum name such as TYPE_FP32, or None when unsupported."""
    return BY_CONFIG.get(name)


def from_onnx(name: str) -> DataType | None:
    """The type for an ONNX Runtime type string such as tensor(float), or None when unsupported."""
    return BY_ONNX.get(name)


@dataclass(frozen=True, slots=True)
class ModelTensor:
    """An input or output as the model file declares it.

    `datatype` is None when the agent cannot serve the element type; `shape` holds None for a
    dimension the model leaves dynamic.
    """

    name: str
    datatype: DataType | None
    type_name: str  # the runtime's own spelling, for messages
    shape: tuple[int | None, ...]
