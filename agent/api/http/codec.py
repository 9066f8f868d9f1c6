"""KServe v2 HTTP/REST codec: JSON bodies and Triton's binary tensor extension.

Pure: bytes in, `agent.tensors.request` types out, and back. Binary extension: the body is a JSON
header of `header_length` bytes followed by the raw tensors in the order of the inputs (or
outputs) that carry `parameters.binary_data_size`.

A JSON document of `json_spans.SPLICE_MIN_BYTES` or more has its numeric `data` arrays cut out
before it is parsed and converted straight into numpy arrays once each input's header and limits
are checked (`agent.api.http.json_spans`): decoding it costs about its size again, not five
times, with the same answers and errors as the plain path.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from agent.api.http.json_spans import SPLICE_MIN_BYTES, MalformedSpanError, SplicedData, splice
from agent.errors import InvalidInputError
from agent.tensors import datatypes
from agent.tensors.limits import TensorLimits, check_declared
from agent.tensors.request import (
    InferInput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    as_bytes,
    check_shape,
    classification_count,
    shared_memory_outputs,
    shared_memory_ref,
    tensor_from_bytes,
    tensor_to_bytes,
)

HEADER_LENGTH = "Inference-Header-Content-Length"


# Binary-tensor clients send the same small JSON header with every request (only the tensor
# bytes after it change), so its parse is remembered by its exact bytes; larger headers carry
# JSON data and are parsed every time.
_PLAN_HEADER_MAX = 4096


_PLAN_CACHE_SIZE = 64


def decode_infer_request(
    body: bytes | memoryview,
    header_length: int | None = None,
    *,
    limits: TensorLimits | None = None,
) -> InferRequest:
    """Decode a KServe v2 infer request body.

    Args:
        body: the whole HTTP body.
        header_length: value of the Inference-Header-Content-Length header, when present.
        limits: what each input may declare (checked before its data is decoded); None: no limit.

    Raises:
        InvalidInputError: malformed JSON, bad tensor description or data, or binary lengths that
            do not add up to the body.
        PayloadTooLargeError: an input's declared shape is over `limits`.
    """
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if header_length < 0:
            raise InvalidInputError(f"{HEADER_LENGTH} must not be negative, got {header_length}")
        if header_length > len(body):
            raise InvalidInputError(
                f"{HEADER_LENGTH} is {header_length} but the body has only {len(body)} bytes"
            )
        header, binary = body[:header_length], memoryview(body)[header_length:]
        if len(header) <= _PLAN_HEADER_MAX:
            plan = _cached_plan(bytes(header))
            if plan is not None:
                return _decode_planned(plan, binary, limits)
    spliced = splice(header) if len(header) >= SPLICE_MIN_BYTES else None
    if spliced is None:
        return _decode_document(_load_json_object(header), binary, limits, None)
    document, spans = spliced
    try:
        doc = _load_json_object(document)
    except InvalidInputError:  # its line and column would be the spliced document's
        doc = None
    try:
        if doc is not None:
            return _decode_document(doc, binary, limits, spans)
    except InvalidInputError as exc:
        try:  # the plain path would have found a malformed number before anything else
            spans.check_syntax()
        except MalformedSpanError:
            pass
        else:
            raise exc from None
    except MalformedSpanError:
        pass
    # Not valid JSON: the plain path parses it again, for its exact error (with line and column).
    return _decode_document(_load_json_object(header), binary, limits, None)


def _decode_document(
    doc: dict[str, Any],
    binary: memoryview,
    limits: TensorLimits | None,
    spans: SplicedData | None,
) -> InferRequest:
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):  # empty is fine: a model's inputs may all be optional
        raise InvalidInputError("request must have an 'inputs' list")
    offset = 0
    inputs: list[InferInput] = []
    for raw in raw_inputs:
        tensor, used = _decode_input(raw, binary, offset, limits, spans)
        offset += used
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInputError(
            f"binary tensor data is {len(binary)} bytes but the inputs' binary_data_size "
            f"add up to {offset}"
        )
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInputError("'id' must be a string")
    params = _parameters(doc, "request")
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidInputError("parameter 'binary_data_output' must be a boolean")
    return InferRequest(
        inputs=tuple(inputs),
        id=request_id,
        outputs=_decode_outputs(doc.get("outputs")),
        binary_output=binary_output,
        parameters=params,
    )


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str
    datatype: str
    shape: tuple[int, ...]
    size: int  # binary_data_size


@dataclass(frozen=True, slots=True)
class _RequestPlan:
    """A request header whose inputs are all binary: everything but the tensor bytes."""

    inputs: tuple[_InputPlan, ...]
    id: str | None
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool
    parameters: Mapping[str, Any]


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _cached_plan(header: bytes) -> _RequestPlan | None:
    """The plan of a valid all-binary header; None for anything else (the full path decides).

    Invalid headers are not planned, so their error is the one the full decoder reports.
    """
    try:
        doc = _load_json_object(header)
        raw_inputs = doc.get("inputs")
        if not isinstance(raw_inputs, list) or not raw_inputs:
            return None
        inputs: list[_InputPlan] = []
        for raw in raw_inputs:
            name, datatype, shape, params = _input_header(raw)
            assert isinstance(raw, dict)  # _input_header checked it
            size = params.get("binary_data_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or "data" in raw:
                return None
            inputs.append(_InputPlan(name, datatype, shape, size))
        request_id = doc.get("id")
        params = _parameters(doc, "request")
        binary_output = params.get("binary_data_output", False)
        if (request_id is not None and not isinstance(request_id, str)) or not isinstance(
            binary_output, bool
        ):
            return None
        outputs = _decode_outputs(doc.get("outputs"))
    except InvalidInputError:
        return None
    return _RequestPlan(tuple(inputs), request_id, outputs, binary_output, MappingProxyType(params))


def _decode_planned(
    plan: _RequestPlan, binary: memoryview, limits: TensorLimits | None
) -> InferRequest:
    """The tensors of a planned request; checks and messages as `_decode_input`'s binary case."""
    offset = 0
    inputs: list[InferInput] = []
    for spec in plan.inputs:
        if limits is not None:  # resource limits: before the tensor is split or copied
            check_declared(spec.name, spec.datatype, spec.shape, limits)
        end = offset + spec.size
        if end > len(binary):
            raise InvalidInputError(
                f"input '{spec.name}': binary_data_size {spec.size} runs past the end of the body"
            )
        try:
            data = tensor_from_bytes(binary[offset:end], spec.datatype, spec.shape)
        except InvalidInputError as exc:
            raise InvalidInputError(f"input '{spec.name}': {exc.message}") from None
        inputs.append(InferInput(spec.name, spec.datatype, spec.shape, data))
        offset = end
    if offset != len(binary):
        raise InvalidInputError(
            f"binary tensor data is {len(binary)} bytes but the inputs' binary_data_size "
            f"add up to {offset}"
        )
    return InferRequest(
        inputs=tuple(inputs),
        id=plan.id,
        outputs=plan.outputs,
        binary_output=plan.binary_output,
        parameters=plan.parameters,
    )


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, int | None]:
    """Encode a response; binary outputs follow the JSON header.

    Returns:
        The body and the JSON header's length, or None when every output is JSON.

    Raises:
        InvalidInputError: a BYTES output that is not UTF-8 was asked for as JSON.
    """
    wanted = {o.name: o.binary for o in request.outputs} if request.outputs is not None else {}
    asked = [wanted.get(out.name) for out in response.outputs]
    binary_flags = [request.binary_output if b is None else b for b in asked]
    in_shm = shared_memory_outputs(request)
    if (
        not in_shm
        and not response.parameters
        and response.outputs
        and all(binary_flags)
        and all(out.datatype != "BYTES" for out in response.outputs)
    ):
        chunks = [np.ascontiguousarray(out.data).tobytes() for out in response.outputs]
        shapes = tuple(
            (out.name, out.datatype, out.data.shape, len(raw))
            for out, raw in zip(response.outputs, chunks, strict=True)
        )
        header = _binary_response_header(
            response.model_name, response.model_version, response.id, shapes
        )
        return b"".join([header, *chunks]), len(header)
    outputs: list[dict[str, Any]] = []
    chunks = []
    for out, binary in zip(response.outputs, binary_flags, strict=True):
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(out.data.shape),
        }
        if out.name in in_shm:
            pass  # the data is in the client's region; Triton sends no parameters either
        elif binary:
            raw = tensor_to_bytes(out.data, out.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _tensor_to_json(out.data, out.datatype, out.name)
        outputs.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id is not None:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = dict(response.parameters)
    doc["outputs"] = outputs
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _binary_response_header(
    model: str,
    version: str,
    request_id: str | None,
    outputs: tuple[tuple[str, str, tuple[int, ...], int], ...],
) -> bytes:
    """The JSON header of a response whose outputs are all binary: the same for every request
    of one shape, so it is built once."""
    doc: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        doc["id"] = request_id
    doc["outputs"] = [
        {
            "name": name,
            "datatype": datatype,
            "shape": list(shape),
            "parameters": {"binary_data_size": size},
        }
        for name, datatype, shape, size in outputs
    ]
    return json.dumps(doc, separators=(",", ":")).encode()


def _load_json_object(raw: bytes | memoryview) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"malformed JSON in request: {exc}") from None
    except RecursionError:  # nesting deeper than the parser's stack, e.g. "[[[[...": hostile
        raise InvalidInputError("malformed JSON in request: nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object")
    return doc


def _parameters(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError(f"'parameters' of {where} must be an object")
    return params


def _input_header(raw: object) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    """An input's name, datatype, shape and parameters, checked."""
    if not isinstance(raw, dict):
        raise InvalidInputError("each input must be a JSON object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError("each input must have a 'name'")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatypes.from_kserve(datatype) is None:
        raise InvalidInputError(f"invalid datatype for input {name}: {datatype!r}")
    shape_raw = raw.get("shape")
    if not isinstance(shape_raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape_raw
    ):
        raise InvalidInputError(f"input '{name}' must have a 'shape' of non-negative integers")
    try:
        check_shape(shape_raw, datatype)
    except InvalidInputError as exc:
        raise InvalidInputError(f"input '{name}': {exc.message}") from None
    return name, datatype, tuple(shape_raw), _parameters(raw, f"input '{name}'")


def _decode_input(
    raw: object,
    binary: memoryview,
    offset: int,
    limits: TensorLimits | None,
    spans: SplicedData | None = None,
) -> tuple[InferInput, int]:
    name, datatype, shape, params = _input_header(raw)
    if limits is not None:  # resource limits: before the tensor is split, copied or mapped
        check_declared(name, datatype, shape, limits)
    assert isinstance(raw, dict)  # _input_header checked it
    shm = shared_memory_ref(params, f"input '{name}'")
    if shm is not None:
        if "data" in raw or "binary_data_size" in params:
            raise InvalidInputError(
                f"input '{name}' has shared memory parameters and also data in the request"
            )
        empty = np.empty(0, dtype=datatypes.BY_KSERVE[datatype].numpy)
        return InferInput(name, datatype, shape, empty, shm), 0
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInputError(f"input '{name}': binary_data_size must be a non-negative int")
        if "data" in raw:
            raise InvalidInputError(f"input '{name}' has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise InvalidInputError(
                f"input '{name}': binary_data_size {size} runs past the end of the body"
            )
        try:
            data = tensor_from_bytes(binary[offset : offset + size], datatype, shape)
        except InvalidInputError as exc:
            raise InvalidInputError(f"input '{name}': {exc.message}") from None
        return InferInput(name, datatype, shape, data), size
    if "data" not in raw:
        raise InvalidInputError(f"input '{name}' has neither 'data' nor binary_data_size")
    values = raw["data"]
    if spans is not None and spans.owns(values):
        assert isinstance(values, str)  # owns() checked it
        data = spans.tensor(values, datatype, shape, name, _tensor_from_json)
    else:
        data = _tensor_from_json(values, datatype, shape, name)
    return InferInput(name, datatype, shape, data), 0


def _tensor_from_json(
    values: object, datatype: str, shape: tuple[int, ...], name: str
) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = list(_flatten(values))
        if not all(isinstance(v, str | bytes) for v in flat):
            raise InvalidInputError(f"input '{name}': BYTES data must be strings")
        arr = np.empty(len(flat), dtype=np.object_)
        try:
            arr[:] = [v.encode() if isinstance(v, str) else v for v in flat]
        except UnicodeEncodeError:  # JSON text can carry lone surrogates ("\ud800")
            raise InvalidInputError(
                f"input '{name}': BYTES data must be valid Unicode (a lone surrogate is not)"
            ) from None
    else:
        dtype = datatypes.BY_KSERVE[datatype].numpy
        if datatype == "BOOL":
            flat = list(_flatten(values))
            if not all(isinstance(v, bool) for v in flat):
                raise InvalidInputError(f"input '{name}': BOOL data must be true or false")
        elif not isinstance(values, list):
            raise InvalidInputError(f"input '{name}': 'data' must be a list")
        arr = _numeric_from_json(values, dtype, datatype, name)
    if arr.size != count:
        raise InvalidInputError(
            f"input '{name}' has {arr.size} elements but shape {list(shape)} needs {count}"
        )
    return arr.reshape(shape)


def _numeric_from_json(values: object, dtype: np.dtype, datatype: str, name: str) -> np.ndarray:
    """Convert JSON numbers, refusing values of the wrong kind instead of casting them."""
    try:
        raw = np.asarray(values).ravel()
    except ValueError as exc:  # ragged nesting
        raise InvalidInputError(f"input '{name}': data does not fit {datatype}: {exc}") from None
    if datatype == "BOOL":
        return raw.astype(np.bool_)
    if raw.size == 0:
        return raw.astype(dtype)
    integral = dtype.kind in "iu"
    if raw.dtype.kind in "iu" and any(v is True or v is False for v in _flatten(values)):
        raise InvalidInputError(f"input '{name}': {datatype} data must be numbers, not booleans")
    # numpy turns integers beyond int64 into floats or objects: check those as Python ints.
    big_ints = integral and raw.dtype.kind in "fO"
    if big_ints:
        flat = list(_flatten(values))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raw = np.array(flat, dtype=object)
        else:
            big_ints = False
    if not big_ints and raw.dtype.kind not in ("iu" if integral else "iuf"):
        kind = "integers" if integral else "numbers"
        raise InvalidInputError(f"input '{name}': {datatype} data must be {kind}")
    if integral:
        info = np.iinfo(dtype)
        if int(min(raw)) < info.min or int(max(raw)) > info.max:
            raise InvalidInputError(
                f"input '{name}': a value is outside the range of {datatype} "
                f"[{info.min}, {info.max}]"
            )
    with np.errstate(over="ignore"):  # a float past FP16/FP32's range is infinity, as in C
        return raw.astype(dtype)


def _flatten(values: object) -> Iterator[object]:
    if isinstance(values, list):
        for v in values:
            yield from _flatten(v)
    else:
        yield values


def _tensor_to_json(data: np.ndarray, datatype: str, name: str) -> list[Any]:
    if datatype != "BYTES":
        return list(data.ravel().tolist())
    try:
        return [as_bytes(v).decode() for v in data.ravel()]
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"output '{name}' is not UTF-8 text; request it with binary_data: true"
        ) from None


def _decode_outputs(raw: object) -> tuple[RequestedOutput, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidInputError("'outputs' must be a list")
    result: list[RequestedOutput] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError("each requested output must be an object with a 'name'")
        params = _parameters(item, f"output '{item['name']}'")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInputError(f"output '{item['name']}': binary_data must be a boolean")
        shm = shared_memory_ref(params, f"output '{item['name']}'")
        count = classification_count(params, item["name"])
        result.append(RequestedOutput(item["name"], binary, shm, count))
    return tuple(result)


def tensor_from_json(
    values: object, datatype: str, shape: tuple[int, ...], name: str
) -> np.ndarray:
    """JSON values (nested or flat) as an array of `datatype` and `shape`.

    Raises:
        InvalidInputError: values of the wrong kind or count.
    """
    return _tensor_from_json(values, datatype, shape, name)


def tensor_to_json(data: np.ndarray, datatype: str, name: str) -> list[Any]:
    """An array as a flat JSON list (BYTES as text).

    Raises:
        InvalidInputError: a BYTES element is not UTF-8.
    """
    return _tensor_to_json(data, datatype, name)
