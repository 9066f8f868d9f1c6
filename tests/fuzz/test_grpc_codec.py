"""The gRPC ModelInferRequest decoder on hostile messages.

Property: whatever the inputs, shapes, datatypes, typed contents, raw buffers and parameters,
`decode_infer_request` returns a request whose tensors have the declared shapes, or raises
`InvalidInputError` (INVALID_ARGUMENT with its message), never anything else (INTERNAL).
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.grpc.codec import decode_infer_request
from agent.errors import InvalidInputError, PayloadTooLargeError
from agent.proto import grpc_service_pb2 as pb
from agent.tensors.limits import TensorLimits
from agent.tensors.request import InferRequest
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import assert_reason, infer_request_messages


def _decoded_or_refused(
    message: pb.ModelInferRequest, limits: TensorLimits | None = None
) -> InferRequest | None:
    try:
        request = decode_infer_request(message, limits=limits)
    except (InvalidInputError, PayloadTooLargeError) as exc:
        assert_reason(exc)
        return None
    for tensor in request.inputs:
        if tensor.shm is None:
            assert tensor.data.shape == tensor.shape
    return request


def _zero_sized_huge() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="a", datatype="FP32", shape=[0, 2**62])
    message.raw_input_contents.append(b"")
    return message


@FUZZ
@given(infer_request_messages())
@example(_zero_sized_huge())  # found: numpy refused the shape with a ValueError (INTERNAL)
def test_infer_requests_decode_or_are_refused(message: pb.ModelInferRequest) -> None:
    _decoded_or_refused(message)
    _decoded_or_refused(message, TensorLimits(max_bytes=64, max_bytes_elements=4))


@FUZZ
@given(st.binary(max_size=200))
def test_wire_bytes_that_parse_decode_or_are_refused(wire: bytes) -> None:
    try:
        message = pb.ModelInferRequest.FromString(wire)
    except DecodeError:
        return  # grpc answers these itself before a handler runs
    _decoded_or_refused(message)


def test_contents_and_raw_contents_together_are_refused() -> None:
    """Found while writing these tests: the typed contents were silently ignored."""
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    tensor.contents.int_contents.extend([7, 8])
    message.raw_input_contents.append(b"\x01\x00\x00\x00\x02\x00\x00\x00")
    with pytest.raises(InvalidInputError, match=r"contents.*raw_input_contents for 'INPUT0'"):
        decode_infer_request(message)


def test_raw_buffer_of_the_wrong_size_for_the_datatype_is_refused() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="INPUT0", datatype="FP64", shape=[2])
    message.raw_input_contents.append(b"\x00" * 8)  # 2 x FP32, not 2 x FP64
    with pytest.raises(InvalidInputError, match=r"INPUT0.*needs 16"):
        decode_infer_request(message)
