"""KServe v2 gRPC messages ↔ the agent's protocol types (pure; no server, no I/O).

Input tensors come either all as `raw_input_contents` (one little-endian buffer per input, the
binary tensor format) or as typed `contents`; outputs always go back as `raw_output_contents`,
as Triton sends them. Inputs in shared memory (`shared_memory_*` parameters) have no raw buffer,
so the raw buffers belong to the other inputs in order; an output written to shared memory keeps
an empty raw buffer, so raw buffers and outputs stay aligned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from agent.errors import InvalidInputError
from agent.proto import grpc_service_pb2 as pb
from agent.tensors import datatypes
from agent.tensors.limits import TensorLimits, check_declared
from agent.tensors.request import (
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    check_shape,
    classification_count,
    shared_memory_outputs,
    shared_memory_ref,
    tensor_from_bytes,
    tensor_to_bytes,
)

# KServe datatype → the InferTensorContents field that carries it (FP16 and BF16: raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def decode_infer_request(
    request: pb.ModelInferRequest, *, limits: TensorLimits | None = None
) -> InferRequest:
    """Turn a ModelInferRequest into the agent's request type.

    Raises:
        InvalidInputError: unknown datatype, negative dims, raw buffers that do not match the
            inputs, typed contents of the wrong kind or count.
        PayloadTooLargeError: an input's declared shape is over `limits` (None: no limit).
    """
    # Each protobuf field is read once: every access builds a wrapper object (half the cost of
    # this function when it read them as needed).
    raw = request.raw_input_contents
    tensors = list(request.inputs)
    refs = [
        shared_memory_ref(_parameters(t.parameters), f"input '{t.name}'") if t.parameters else None
        for t in tensors
    ]
    in_band = sum(ref is None for ref in refs)
    if raw:
        for tensor, ref in zip(tensors, refs, strict=True):
            if ref is None and tensor.HasField("contents"):
                raise InvalidInputError(  # Triton's words
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{request.model_name}'"
                )
    if raw and len(raw) != in_band:
        raise InvalidInputError(
            f"raw_input_contents has {len(raw)} buffers for {in_band} inputs not in shared "
            "memory; send raw contents for every such input or for none"
        )
    inputs = []
    index = 0
    for tensor, ref in zip(tensors, refs, strict=True):
        name, datatype = tensor.name, tensor.datatype
        shape = input_shape(tensor)
        if limits is not None:  # resource limits: before the tensor is split, copied or mapped
            check_declared(name, datatype, shape, limits)
        if ref is not None:
            if tensor.HasField("contents"):
                raise InvalidInputError(
                    f"input '{name}' has shared memory parameters and also contents"
                )
            empty = np.empty(0, dtype=datatypes.BY_KSERVE[datatype].numpy)
            inputs.append(InferInput(name, datatype, shape, empty, ref))
            continue
        if raw:  # (contents beside raw_input_contents were refused above, as Triton does)
            try:
                data = tensor_from_bytes(raw[index], datatype, shape)
            except InvalidInputError as exc:
                raise InvalidInputError(f"input '{name}': {exc.message}") from None
            index += 1
        else:
            data = _from_contents(tensor, shape)
        inputs.append(InferInput(name, datatype, shape, data))
    return InferRequest(
        inputs=tuple(inputs),
        id=request.id or None,
        outputs=requested_outputs(request),
        parameters=request_parameters(request),
    )


def input_shape(tensor: pb.ModelInferRequest.InferInputTensor) -> tuple[int, ...]:
    """An input's shape, after the checks that need no data (datatype, sign, size).

    Raises:
        InvalidInputError: unknown datatype, a negative dimension, a shape no array can have.
    """
    name, datatype = tensor.name, tensor.datatype
    if datatypes.from_kserve(datatype) is None:
        raise InvalidInputError(f"invalid datatype for input {name}: {datatype!r}")
    shape = tuple(tensor.shape)  # int64 in the message: Python ints
    if any(d < 0 for d in shape):
        raise InvalidInputError(f"input '{name}' has a negative dimension")
    try:
        check_shape(shape, datatype)
    except InvalidInputError as exc:
        raise InvalidInputError(f"input '{name}': {exc.message}") from None
    return shape


def requested_outputs(request: pb.ModelInferRequest) -> tuple[RequestedOutput, ...] | None:
    """The outputs the request names (None: all of them).

    Raises:
        InvalidInputError: an output's shared-memory parameters are incomplete or of wrong type.
    """
    outputs = []
    for o in request.outputs:
        if not o.parameters:
            outputs.append(RequestedOutput(o.name))
            continue
        params = _parameters(o.parameters)
        shm = shared_memory_ref(params, f"output '{o.name}'")
        outputs.append(RequestedOutput(o.name, None, shm, classification_count(params, o.name)))
    return tuple(outputs) or None


def request_parameters(request: pb.ModelInferRequest) -> dict[str, Any]:
    """The request's parameters as plain values."""
    params = request.parameters
    return _parameters(params) if params else {}


def encode_infer_response(
    response: InferResponse, request: InferRequest | None = None
) -> pb.ModelInferResponse:
    """The agent's response as a ModelInferResponse with raw output contents (empty for the
    outputs `request` asked for in shared memory)."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
    )
    if response.parameters:
        set_parameters(message.parameters, response.parameters)
    in_shm = shared_memory_outputs(request) if request is not None else {}
    for out in response.outputs:
        message.outputs.add(name=out.name, datatype=out.datatype, shape=list(out.data.shape))
        in_band = out.name not in in_shm
        message.raw_output_contents.append(
            tensor_to_bytes(out.data, out.datatype) if in_band else b""
        )
    return message


def set_parameters(target: Any, params: Mapping[str, Any]) -> None:
    """Fill a protobuf map of InferParameter from plain values (bool, int, float, str)."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def _from_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...]
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidInputError(
            f"input '{tensor.name}': {tensor.datatype} can only be sent in raw_input_contents"
        )
    values = list(getattr(tensor.contents, field))
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInputError(
            f"input '{tensor.name}' has {len(values)} elements in contents.{field} "
            f"but shape {list(shape)} needs {count}"
        )
    dtype = datatypes.BY_KSERVE[tensor.datatype]
    if tensor.datatype == "BYTES":
        arr = np.empty(count, dtype=np.object_)
        arr[:] = values
        return arr.reshape(shape)
    if dtype.numpy.kind in "iu":
        info = np.iinfo(dtype.numpy)
        if values and (min(values) < info.min or max(values) > info.max):
            raise InvalidInputError(
                f"input '{tensor.name}': a value is outside the range of {tensor.datatype}"
            )
    return np.asarray(values, dtype=dtype.numpy).reshape(shape)


def _parameters(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, choice) if choice else None
    return out


def decode_log_settings(request: pb.LogSettingsRequest) -> dict[str, Any]:
    """Triton's log settings map as plain values (a value with no field set is None)."""
    changes: dict[str, Any] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
        changes[key] = None if choice is None else getattr(value, choice)
    return changes


def encode_log_settings(settings: dict[str, Any]) -> pb.LogSettingsResponse:
    """Every log setting, each in the oneof field of its type."""
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        target = response.settings[key]
        if isinstance(value, bool):
            target.bool_param = value
        elif isinstance(value, int):
            target.uint32_param = value
        else:
            target.string_param = str(value)
    return response


def decode_trace_settings(request: pb.TraceSettingRequest) -> dict[str, Any]:
    """Triton's trace settings map as the HTTP body has them: `trace_level` a list of strings,
    the others one string; no strings is None (clear)."""
    changes: dict[str, Any] = {}
    for key, value in request.settings.items():
        values = list(value.value)
        if not values:
            changes[key] = None
        elif key == "trace_level":
            changes[key] = values
        else:
            changes[key] = values[0] if len(values) == 1 else values
    return changes


def encode_trace_settings(settings: dict[str, Any]) -> pb.TraceSettingResponse:
    """Every trace setting as a list of strings."""
    response = pb.TraceSettingResponse()
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
    return response
