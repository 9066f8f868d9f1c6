"""ModelInfer messages read and written as bytes, for the calls a client repeats (pure, no I/O).

A client sends one request description again and again with new tensor data. Serialized, a
ModelInferRequest is that description (fields 1-6) followed by its `raw_input_contents` (field
7, written last: protobuf encoders write fields in number order). `decode_serialized` cuts the
raw buffers off the end, reads the description once per distinct bytes through
`grpc_codec`'s own checks and caches it; a repeated call then costs the cut and the tensor views.
Anything else (typed contents, shared memory, raw buffers that do not match the inputs, fields
out of order or unknown, a description that fails a check) returns None and the caller parses
the message whole, so its answer, errors included, is the full decoder's.

`decode_infer` is the one decode of a ModelInferRequest's bytes, on both engines and for both
infer RPCs: `decode_serialized`, or when it declines, the full parse through `grpc_codec`.
`encode_serialized` writes a ModelInferResponse's bytes directly, the same bytes as
`grpc_codec.encode_infer_response(...).SerializeToString()`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from agent.api.grpc import codec as grpc_codec
from agent.errors import InvalidInputError
from agent.proto import grpc_service_pb2 as pb
from agent.tensors import datatypes
from agent.tensors.limits import TensorLimits, check_declared
from agent.tensors.request import (
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    shared_memory_outputs,
    tensor_from_bytes,
    tensor_to_bytes,
)

__all__ = [
    "DecodedInfer",
    "PlanCacheInfo",
    "PlannedInput",
    "RequestPlan",
    "decode_infer",
    "decode_serialized",
    "encode_serialized",
    "plan_cache_info",
]

_RAW_INPUT_TAG = 0x3A  # field 7 (raw_input_contents), length-delimited
_PLAN_CACHE_SIZE = 256
_PLAN_PREFIX_MAX = 4096  # longer descriptions are parsed per call (and not kept)
_RECENT = 8
# The descriptions last planned, newest first: a repeated call finds its own by comparing
# bytes, without reading its fields.
_recent: list[tuple[bytes, RequestPlan]] = []
_planned = [0]  # requests decoded from a plan


@dataclass(frozen=True, slots=True)
class PlanCacheInfo:
    """How many requests were decoded from a plan, and how many descriptions were read."""

    planned: int
    described: int


def plan_cache_info() -> PlanCacheInfo:
    """The counts since the process started (the tests read them)."""
    return PlanCacheInfo(_planned[0], _cached_plan.cache_info().misses)


@dataclass(frozen=True, slots=True)
class PlannedInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any] | None  # None: BYTES (its length is only known from its data)
    nbytes: int


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """A request's description, checked: everything but the tensor bytes."""

    model_name: str
    model_version: str | None
    inputs: tuple[PlannedInput, ...]
    id: str | None
    outputs: tuple[RequestedOutput, ...] | None
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DecodedInfer:
    """A ModelInferRequest read: the model it is for and the agent's request."""

    model_name: str
    model_version: str | None
    request: InferRequest


def decode_infer(data: bytes, *, limits: TensorLimits | None = None) -> DecodedInfer:
    """A serialized ModelInferRequest, whatever its shape: from its plan when it has the common
    shape, else parsed whole (the same request, or the same error, either way).

    Raises:
        DecodeError: the bytes are not a ModelInferRequest.
        InvalidInputError: as `grpc_codec.decode_infer_request`.
        PayloadTooLargeError: an input's declared shape is over `limits`.
    """
    planned = decode_serialized(data, limits=limits)
    if planned is not None:
        plan, request = planned
        return DecodedInfer(plan.model_name, plan.model_version, request)
    message = pb.ModelInferRequest.FromString(data)
    request = grpc_codec.decode_infer_request(message, limits=limits)
    return DecodedInfer(message.model_name, message.model_version or None, request)


def decode_serialized(
    data: bytes, *, limits: TensorLimits | None = None
) -> tuple[RequestPlan, InferRequest] | None:
    """The plan and the request of a serialized ModelInferRequest in the common shape; None for
    any other message (parse it whole then).

    Raises:
        InvalidInputError: a raw buffer does not match its input's shape and datatype.
        PayloadTooLargeError: an input's declared shape is over `limits`.
    """
    # Every step is bounded by the plan, not by the message: a request of many tiny fields
    # costs no more here than a short one (the full parse then decides about it).
    found = _recent_plan(data)
    if found is None:
        prefix_end = _description_end(data)
        if prefix_end < 0:
            return None
        plan = _cached_plan(data[:prefix_end])
        if plan is None:
            return None
        raws = _raw_buffers(data, prefix_end, len(plan.inputs))
        if raws is None:
            return None
        _recent.insert(0, (data[:prefix_end], plan))
        del _recent[_RECENT:]
    else:
        plan, raws = found
    inputs = []
    for spec, raw in zip(plan.inputs, raws, strict=True):
        name, datatype, shape = spec.name, spec.datatype, spec.shape
        if limits is not None:  # resource limits: before the tensor is viewed
            check_declared(name, datatype, shape, limits)
        if spec.dtype is None or len(raw) != spec.nbytes:  # BYTES, or the error's words
            try:
                tensor = tensor_from_bytes(raw, datatype, shape)
            except InvalidInputError as exc:
                raise InvalidInputError(f"input '{name}': {exc.message}") from None
        else:
            tensor = np.frombuffer(raw, dtype=spec.dtype).reshape(shape)
        inputs.append(InferInput(name, datatype, shape, tensor))
    request = InferRequest(
        inputs=tuple(inputs), id=plan.id, outputs=plan.outputs, parameters=plan.parameters
    )
    _planned[0] += 1
    return plan, request


def _recent_plan(data: bytes) -> tuple[RequestPlan, list[memoryview]] | None:
    """A recent plan whose description `data` starts with, and the raw buffers after it.

    A description's bytes are whole fields: when `data` starts with them and a raw buffer
    follows, its description is exactly those fields (no scan of them needed).
    """
    for prefix, plan in _recent:
        if data.startswith(prefix):
            raws = _raw_buffers(data, len(prefix), len(plan.inputs))
            if raws is not None:
                return plan, raws
    return None


def _description_end(data: bytes) -> int:
    """Where the fields before the first raw buffer end; -1 unless each is a length-delimited
    field with a one-byte tag (fields 1-15), as ModelInferRequest's fields 1-6 are, and they
    end within `_PLAN_PREFIX_MAX` bytes."""
    size = len(data)
    pos = 0
    while pos < size:
        if pos > _PLAN_PREFIX_MAX:
            return -1
        tag = data[pos]
        if tag == _RAW_INPUT_TAG:
            break
        if tag & 0x87 != 0x02:  # a multi-byte tag (field 16 and up) or not length-delimited
            return -1
        pos = _field_end(data, pos + 1, size)
        if pos < 0:
            return -1
    return pos if pos <= _PLAN_PREFIX_MAX else -1


def _raw_buffers(data: bytes, pos: int, count: int) -> list[memoryview] | None:
    """The `count` raw buffers from `pos` to the end; None when anything else is there."""
    size = len(data)
    view = memoryview(data)
    raws: list[memoryview] = []
    while pos < size:
        if data[pos] != _RAW_INPUT_TAG or len(raws) == count:
            return None
        end = _field_end(data, pos + 1, size)
        if end < 0:
            return None
        raws.append(view[end - _length(data, pos + 1) : end])
        pos = end
    return raws if len(raws) == count else None


def _field_end(data: bytes, pos: int, size: int) -> int:
    """The end of a length-delimited field whose length varint starts at `pos`; -1 when the
    field is cut off or its length takes over 5 bytes."""
    if pos >= size:
        return -1
    first = data[pos]
    if first < 0x80:  # the common case: a short field
        end = pos + 1 + first
        return end if end <= size else -1
    for last in range(pos + 1, min(pos + 5, size)):
        if data[last] < 0x80:
            end = last + 1 + _length(data, pos)
            return end if end <= size else -1
    return -1


def _length(data: bytes, pos: int) -> int:
    """The varint at `pos` (known to end within 5 bytes)."""
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        pos += 1
        shift += 7


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _cached_plan(prefix: bytes) -> RequestPlan | None:
    """The checked description, or None when the full decoder must see the message (what it
    refuses is refused there, in its words)."""
    try:
        message = pb.ModelInferRequest.FromString(prefix)
    except DecodeError:
        return None
    if not message.inputs:
        return None
    inputs = []
    for tensor in message.inputs:
        if tensor.parameters or tensor.HasField("contents"):  # shared memory, typed contents
            return None
        try:
            shape = grpc_codec.input_shape(tensor)
        except InvalidInputError:
            return None
        datatype = tensor.datatype
        if datatype == "BYTES":
            inputs.append(PlannedInput(tensor.name, datatype, shape, None, 0))
        else:
            dtype = datatypes.BY_KSERVE[datatype]
            nbytes = math.prod(shape) * dtype.itemsize
            inputs.append(PlannedInput(tensor.name, datatype, shape, dtype.numpy, nbytes))
    try:
        outputs = grpc_codec.requested_outputs(message)
        params = grpc_codec.request_parameters(message)
    except InvalidInputError:
        return None
    return RequestPlan(
        message.model_name,
        message.model_version or None,
        tuple(inputs),
        message.id or None,
        outputs,
        MappingProxyType(params),
    )


def encode_serialized(response: InferResponse, request: InferRequest | None = None) -> bytes:
    """A serialized ModelInferResponse with raw output contents (empty for the outputs `request`
    asked for in shared memory): `grpc_codec.encode_infer_response`'s message, as bytes."""
    in_shm = shared_memory_outputs(request) if request is not None else {}
    parts = [_head(response.model_name, response.model_version, response.id or "")]
    raws = []
    for out in response.outputs:
        parts.append(_output(out.name, out.datatype, out.data.shape))
        raw = tensor_to_bytes(out.data, out.datatype) if out.name not in in_shm else b""
        raws.append(_field_head(6, len(raw)))
        raws.append(raw)
    parts += raws
    if response.parameters:  # field 4, rare: protobuf merges fields in any order
        tail = pb.ModelInferResponse()
        grpc_codec.set_parameters(tail.parameters, response.parameters)
        parts.append(tail.SerializeToString())
    return b"".join(parts)


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _head(model_name: str, model_version: str, request_id: str) -> bytes:
    """Fields 1-3 (empty strings are left out, as protobuf leaves them)."""
    return b"".join(
        _string_field(number, text)
        for number, text in ((1, model_name), (2, model_version), (3, request_id))
        if text
    )


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _output(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    """Field 5: one InferOutputTensor (name, datatype, packed shape)."""
    body = _string_field(1, name) + _string_field(2, datatype)
    if shape:
        dims = b"".join(_varint_bytes(d if d >= 0 else d + (1 << 64)) for d in shape)
        body += _field_head(3, len(dims)) + dims
    return _field_head(5, len(body)) + body


def _string_field(number: int, text: str) -> bytes:
    if not text:
        return b""
    raw = text.encode()
    return _field_head(number, len(raw)) + raw


def _field_head(number: int, length: int) -> bytes:
    return bytes((number << 3 | 2,)) + _varint_bytes(length)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
