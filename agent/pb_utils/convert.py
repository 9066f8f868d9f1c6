"""Triton's tensor helpers of `triton_python_backend_utils`: BYTES (de)serialization and the
mapping between numpy types and Triton's numeric data type codes (`TRITONSERVER_DataType`),
config data types ("TYPE_FP32") and KServe datatypes ("FP32").

Re-exported by `agent.pb_utils`; needs only numpy and `agent.tensors.datatypes`.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from agent.tensors import datatypes

# TRITONSERVER_DataType codes, as `triton_to_numpy_type` takes them (BF16, 14, has no numpy type).
_BY_CODE: dict[int, type[Any]] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_BYTES_CODE = 13


def triton_to_numpy_type(data_type: int) -> type[Any] | None:
    """The numpy type of a Triton data type code (11 → np.float32, 13 → np.object_), or None."""
    return _BY_CODE.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The Triton data type code of a numpy type or dtype (np.bytes_ and object: 13), or None."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return _BYTES_CODE
    for code, numpy_type in _BY_CODE.items():
        if code != _BYTES_CODE and dtype == np.dtype(numpy_type):
            return code
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """A BYTES tensor as Triton lays it out: each element (C order) prefixed by its 4-byte
    little-endian length, all in one bytes object held by a 0-d object array, as Triton returns
    it. Elements that are not bytes are str()-ed and UTF-8 encoded. An empty tensor gives an
    empty object array; a tensor of another dtype gives None."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.object_)
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return np.asarray(b"".join(parts), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of a serialized BYTES tensor, as a 1-D object array of bytes.

    Raises:
        ValueError: a length prefix runs past the end of the buffer.
    """
    view = memoryview(bytes(encoded_tensor))
    items: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise ValueError("truncated BYTES tensor: incomplete length prefix")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise ValueError("truncated BYTES tensor: element runs past the end")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


def triton_string_to_numpy(type_string: str) -> type[Any]:
    """The numpy type for a config data type ("TYPE_FP32" → np.float32, TYPE_STRING → object).

    Raises:
        ValueError: not a data type the agent serves.
    """
    found = datatypes.from_config(type_string)
    if found is None:
        raise ValueError(f"unsupported data type {type_string!r}")
    return found.numpy.type


def numpy_to_kserve(dtype: np.dtype) -> str:
    """The KServe datatype of a numpy dtype; str and bytes arrays are BYTES.

    Raises:
        ValueError: a dtype no KServe datatype holds.
    """
    if dtype.kind in "OSU":
        return "BYTES"
    known = datatypes.BY_NUMPY.get(dtype)  # every tensor of every call asks: a lookup first
    if known is not None:
        return known.kserve
    for kind in datatypes.BY_KSERVE.values():
        if kind.numpy == dtype:
            return kind.kserve
    raise ValueError(f"numpy dtype {dtype} has no KServe datatype")
