"""The KServe v2 inference request and response, as every layer sees them, and raw tensors.

Pure data: dataclasses and numpy arrays. The wire codecs (`agent.api.http.codec` for JSON and
Triton's binary tensor extension, `agent.api.grpc.codec` for protobuf) build these; the model's
own contract (names, types, shapes) is checked by `agent.tensors.signature`.

Raw tensors (`tensor_to_bytes` / `tensor_from_bytes`) are row-major, little-endian; BYTES tensors
are a sequence of (uint32 little-endian length, bytes) elements.

Shared-memory extension: a tensor whose parameters carry `shared_memory_region` (with
`shared_memory_byte_size`, and `shared_memory_offset` defaulting to 0) has its bytes in a
registered region; decoding records the reference (`SharedMemoryRef`) and
`agent.serving.shared_memory` moves the bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.errors import InvalidInputError
from agent.tensors import datatypes

_U32 = struct.Struct("<I")

# numpy 1's NPY_MAXDIMS (numpy 2 allows 64): a tensor of higher rank cannot be an array here.
MAX_RANK = 32
_MAX_EXTENT = int(np.iinfo(np.intp).max)


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """A tensor's bytes in a registered shared-memory region."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class InferInput:
    """One decoded input tensor; with `shm` set, `data` is empty until the bytes are read."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    shm: SharedMemoryRef | None = None


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for; `binary` None means the request's default applies."""

    name: str
    binary: bool | None = None
    shm: SharedMemoryRef | None = None  # write the output into this region, not the response
    classification: int | None = None  # the top K classes instead of the tensor (Triton's)


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A decoded inference request."""

    inputs: tuple[InferInput, ...]
    id: str | None = None
    outputs: tuple[RequestedOutput, ...] | None = None  # None: every output of the model
    binary_output: bool = False  # request-level binary_data_output
    parameters: Mapping[str, Any] = field(default_factory=dict)
    # The trace of the request that made this one (an ensemble step, a BLS request): the data
    # plane's own type, opaque down here. None unless that request is traced.
    parent_trace: object | None = None


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a model may read off a request besides its tensors (a Python model's
    `InferenceRequest`: `request_id()`, `parameters()`, `correlation_id()`)."""

    id: str = ""
    # The client's parameters, those Triton consumes itself (sequence, scheduling) left out.
    parameters: Mapping[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0


@dataclass(frozen=True, slots=True)
class OutputTensor:
    """One output tensor of a response."""

    name: str
    datatype: str
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class InferResponse:
    """The result of one inference, before encoding."""

    model_name: str
    model_version: str
    outputs: tuple[OutputTensor, ...]
    id: str | None = None
    # Response parameters (bool, int, float or str values): the model's own (a Python model's
    # `InferenceResponse(parameters=...)`), or the sequence parameters an ensemble answers with.
    parameters: Mapping[str, Any] | None = None


def tensor_to_bytes(data: np.ndarray, datatype: str) -> bytes:
    """Serialize a tensor in the binary tensor format (row-major, little-endian)."""
    if datatype == "BYTES":
        return b"".join(_U32.pack(len(b)) + b for b in (as_bytes(v) for v in data.ravel()))
    return np.ascontiguousarray(data).tobytes()


def check_shape(shape: Sequence[int], datatype: str) -> None:
    """Refuse a shape (of non-negative dims) that no array can have, before anything is sized by
    it: more than `MAX_RANK` dimensions, or dims whose product (zero dims left out, as numpy
    counts them even for an empty tensor) times the element size passes the address space.

    Raises:
        InvalidInputError: the shape is too large; the message shows it.
    """
    if len(shape) > MAX_RANK:
        raise InvalidInputError(
            f"shape has {len(shape)} dimensions, more than the {MAX_RANK} supported"
        )
    extent = math.prod(d for d in shape if d) * datatypes.BY_KSERVE[datatype].numpy.itemsize
    if extent > _MAX_EXTENT:
        raise InvalidInputError(f"shape {list(shape)} is too large for any {datatype} tensor")


def tensor_from_bytes(raw: bytes | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """Deserialize a binary-format tensor.

    Raises:
        InvalidInputError: the shape is too large (`check_shape`), or the byte length does not
            match the shape and datatype.
    """
    check_shape(shape, datatype)
    count = math.prod(shape)
    dtype = datatypes.BY_KSERVE[datatype]
    if datatype == "BYTES":
        items = list(_split_bytes(raw))
        if len(items) != count:
            raise InvalidInputError(
                f"BYTES tensor holds {len(items)} elements but shape {list(shape)} needs {count}"
            )
        arr = np.empty(count, dtype=np.object_)
        arr[:] = items
        return arr.reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInputError(
            f"binary data is {len(raw)} bytes but shape {list(shape)} of {datatype} "
            f"needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype.numpy).reshape(shape)


def classification_count(params: Mapping[str, Any], name: str) -> int | None:
    """An output's `classification` parameter: how many top classes to return (None: absent).

    Raises:
        InvalidInputError: not a positive integer.
    """
    count = params.get("classification")
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidInputError(
            f"output '{name}': classification must be a positive integer number of classes"
        )
    return count


def shared_memory_ref(params: Mapping[str, Any], where: str) -> SharedMemoryRef | None:
    """The tensor's shared-memory parameters, or None when it has none.

    Raises:
        InvalidInputError: only one of region and byte size, or values of the wrong type.
    """
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if region is None and size is None:
        if "shared_memory_offset" in params:
            raise InvalidInputError(f"{where}: shared_memory_offset without shared_memory_region")
        return None
    if region is None or size is None:
        raise InvalidInputError(
            f"{where}: shared_memory_region and shared_memory_byte_size must be given together"
        )
    if not isinstance(region, str) or not region:
        raise InvalidInputError(f"{where}: shared_memory_region must be a non-empty string")
    for label, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInputError(f"{where}: {label} must be a non-negative integer")
    return SharedMemoryRef(region, offset, size)


def shared_memory_outputs(request: InferRequest) -> dict[str, SharedMemoryRef]:
    """The requested outputs that go into shared memory, by name."""
    if request.outputs is None:
        return {}
    return {o.name: o.shm for o in request.outputs if o.shm is not None}


def classified_outputs(request: InferRequest) -> dict[str, int]:
    """The requested outputs asked for as their top K classes, by name."""
    if request.outputs is None:
        return {}
    return {o.name: o.classification for o in request.outputs if o.classification is not None}


def as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _split_bytes(raw: bytes | memoryview) -> Iterator[bytes]:
    view = memoryview(raw)
    pos = 0
    while pos < len(view):
        if pos + 4 > len(view):
            raise InvalidInputError("BYTES tensor ends inside an element's length prefix")
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        if pos + length > len(view):
            raise InvalidInputError("BYTES tensor element runs past the end of its data")
        yield bytes(view[pos : pos + length])
        pos += length
