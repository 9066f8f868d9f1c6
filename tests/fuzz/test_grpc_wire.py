"""ModelInfer read and written as bytes (`agent.api.grpc.wire`) against the protobuf path.

Properties:
* for any bytes (messages a hostile client makes, cut, damaged, fields reordered, and calls
  that repeat a description with other data), `decode_serialized` either declines (None) or
  gives what `FromString` + `decode_infer_request` give: the same request, or the same error;
* `encode_serialized` writes exactly `encode_infer_response(...).SerializeToString()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from agent.api.grpc.codec import decode_infer_request, encode_infer_response
from agent.api.grpc.wire import decode_serialized, encode_serialized
from agent.errors import InvalidInputError, PayloadTooLargeError
from agent.proto import grpc_service_pb2 as pb
from agent.tensors import datatypes
from agent.tensors.limits import TensorLimits
from agent.tensors.request import (
    InferRequest,
    InferResponse,
    OutputTensor,
    RequestedOutput,
    SharedMemoryRef,
)
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import DATATYPES, infer_request_messages

_LIMITS = (None, TensorLimits(max_bytes=64, max_bytes_elements=4))


def _seen(request: InferRequest) -> tuple[Any, ...]:
    """What a request holds, comparable (tensor data as bytes)."""
    inputs = tuple(
        (t.name, t.datatype, t.shape, t.shm, t.data.dtype.str, t.data.shape, _data(t.data))
        for t in request.inputs
    )
    return (inputs, request.id, request.outputs, dict(request.parameters), request.binary_output)


def _data(array: np.ndarray) -> Any:
    return array.tolist() if array.dtype == np.object_ else array.tobytes()


def _full(data: bytes, limits: TensorLimits | None) -> tuple[Any, ...]:
    """The protobuf path's answer: the request (with its model and version) or the error."""
    try:
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return ("undecodable",)
    try:
        request = decode_infer_request(message, limits=limits)
    except (InvalidInputError, PayloadTooLargeError) as exc:
        return (type(exc).__name__, exc.message)
    return (message.model_name, message.model_version or None, _seen(request))


def _wire(data: bytes, limits: TensorLimits | None) -> tuple[Any, ...] | None:
    try:
        decoded = decode_serialized(data, limits=limits)
    except (InvalidInputError, PayloadTooLargeError) as exc:
        return (type(exc).__name__, exc.message)
    if decoded is None:
        return None
    plan, request = decoded
    return (plan.model_name, plan.model_version, _seen(request))


def _check(data: bytes) -> bool:
    """Whether the bytes took the planned path; asserts it agrees with the protobuf path."""
    planned = False
    for limits in _LIMITS:
        got = _wire(data, limits)
        if got is not None:
            assert got == _full(data, limits)
            planned = True
    return planned


@st.composite
def _common(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A request in the shape clients send: raw buffers of the right size for each input."""
    message = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["mlp", "m", ""])),
        model_version=draw(st.sampled_from(["", "1", "x"])),
        id=draw(st.sampled_from(["", "r1"])),
    )
    for index in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from(DATATYPES))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        message.inputs.add(name=f"INPUT{index}", datatype=datatype, shape=shape)
        count = int(np.prod(shape)) if shape else 1
        if datatype == "BYTES":
            items = draw(st.lists(st.binary(max_size=3), min_size=count, max_size=count))
            raw = b"".join(len(i).to_bytes(4, "little") + i for i in items)
        else:
            raw = draw(st.binary(min_size=count * datatypes.BY_KSERVE[datatype].itemsize))
            raw = raw[: count * datatypes.BY_KSERVE[datatype].itemsize]
        message.raw_input_contents.append(raw)
    for name in draw(st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1"]), max_size=2)):
        message.outputs.add(name=name)
    if draw(st.booleans()):
        message.parameters["priority"].uint64_param = draw(st.integers(0, 2**64 - 1))
    return message


_MESSAGES = _common() | infer_request_messages()


@FUZZ
@given(_MESSAGES, st.lists(st.integers(0, 2**16), max_size=3), st.binary(max_size=8))
def test_serialized_requests_decode_as_the_protobuf_path_does(
    message: pb.ModelInferRequest, cuts: list[int], extra: bytes
) -> None:
    data = message.SerializeToString()
    _check(data)
    _check(data)  # again: from the recent plans
    for cut in cuts:  # damaged: cut short, a byte changed, something appended
        _check(data[: cut % (len(data) + 1)])
        if data:
            at = cut % len(data)
            _check(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    _check(data + extra)
    raw = pb.ModelInferRequest(raw_input_contents=message.raw_input_contents).SerializeToString()
    _check(raw + data)  # a raw buffer before the description


@FUZZ
@given(_common(), _common())
def test_a_call_that_repeats_a_description_with_other_data_decodes_as_its_own(
    first: pb.ModelInferRequest, second: pb.ModelInferRequest
) -> None:
    assert _check(first.SerializeToString())
    mixed = pb.ModelInferRequest()
    mixed.CopyFrom(first)  # the first's description, the second's buffers
    del mixed.raw_input_contents[:]
    mixed.raw_input_contents.extend(second.raw_input_contents)
    _check(mixed.SerializeToString())
    _check(second.SerializeToString())


@st.composite
def _responses(draw: st.DrawFn) -> tuple[InferResponse, InferRequest]:
    outputs = []
    in_shm = []
    for index in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(DATATYPES))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        dtype = datatypes.BY_KSERVE[datatype].numpy
        if datatype == "BYTES":
            data = np.array(
                draw(st.lists(st.binary(max_size=4), min_size=int(np.prod(shape)))), np.object_
            )[: int(np.prod(shape))].reshape(shape)
        else:
            data = np.zeros(shape, dtype)
        name = draw(st.sampled_from([f"OUTPUT{index}", "ü", ""]))
        outputs.append(OutputTensor(name, datatype, data))
        if draw(st.booleans()):
            in_shm.append(RequestedOutput(name, None, SharedMemoryRef("r", 0, 8)))
    response = InferResponse(
        draw(st.sampled_from(["mlp", "", "módel"])),
        draw(st.sampled_from(["1", "", "12345678901"])),
        tuple(outputs),
        draw(st.sampled_from([None, "", "id-7"])),
    )
    return response, InferRequest(inputs=(), outputs=tuple(in_shm) or None)


@FUZZ
@given(_responses())
def test_serialized_responses_are_the_protobuf_bytes(
    pair: tuple[InferResponse, InferRequest],
) -> None:
    response, request = pair
    expected = encode_infer_response(response, request).SerializeToString()
    assert encode_serialized(response, request) == expected
    assert encode_serialized(response) == encode_infer_response(response).SerializeToString()
