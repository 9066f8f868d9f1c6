"""ModelInfer as bytes (`agent.api.grpc.wire`): which requests take the planned path, and what
the planned path refuses (the differential properties are in tests/fuzz/test_grpc_wire.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.api.grpc import wire as grpc_wire
from agent.api.grpc.codec import decode_infer_request, encode_infer_response
from agent.api.grpc.wire import decode_serialized, plan_cache_info
from agent.errors import InvalidInputError, PayloadTooLargeError
from agent.proto import grpc_service_pb2 as pb
from agent.tensors.limits import TensorLimits
from agent.tensors.request import InferResponse, OutputTensor


def triton_request(**fields: object) -> pb.ModelInferRequest:
    """What tritonclient sends for one FP32 input and one requested output."""
    message = pb.ModelInferRequest(model_name="mlp", **fields)  # type: ignore[arg-type]
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    message.outputs.add(name="OUTPUT0")
    message.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return message


def test_a_client_s_request_is_planned_with_everything_it_says() -> None:
    message = triton_request(model_version="2", id="r-1")
    message.parameters["priority"].uint64_param = 3
    decoded = decode_serialized(message.SerializeToString())
    assert decoded is not None
    plan, request = decoded
    assert (plan.model_name, plan.model_version, request.id) == ("mlp", "2", "r-1")
    assert request.parameters == {"priority": 3}
    assert [o.name for o in request.outputs or ()] == ["OUTPUT0"]
    assert request.inputs[0].data.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    np.testing.assert_array_equal(
        request.inputs[0].data, decode_infer_request(message).inputs[0].data
    )


def test_the_same_description_with_new_data_is_read_once() -> None:
    before = plan_cache_info()
    for value in (5.0, 6.0, 7.0):
        message = triton_request(id="read-once")
        message.raw_input_contents[0] = np.full(4, value, np.float32).tobytes()
        decoded = decode_serialized(message.SerializeToString())
        assert decoded is not None
        assert decoded[1].inputs[0].data.tolist() == [[value] * 4]
    after = plan_cache_info()
    assert after.planned == before.planned + 3
    assert after.described == before.described + 1


def _with_contents() -> pb.ModelInferRequest:
    message = triton_request()
    del message.raw_input_contents[:]
    message.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    return message


def _in_shared_memory() -> pb.ModelInferRequest:
    message = triton_request()
    del message.raw_input_contents[:]
    message.inputs[0].parameters["shared_memory_region"].string_param = "r"
    message.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    return message


def _unsupported_datatype() -> pb.ModelInferRequest:
    message = triton_request()
    message.inputs[0].datatype = "FP8"
    return message


def _two_buffers() -> pb.ModelInferRequest:
    message = triton_request()
    message.raw_input_contents.append(b"\0" * 16)
    return message


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_with_contents().SerializeToString(), id="typed contents"),
        pytest.param(_in_shared_memory().SerializeToString(), id="shared memory"),
        pytest.param(_unsupported_datatype().SerializeToString(), id="unknown datatype"),
        pytest.param(_two_buffers().SerializeToString(), id="a buffer too many"),
        pytest.param(
            pb.ModelInferRequest(raw_input_contents=[b"\0" * 16]).SerializeToString()
            + pb.ModelInferRequest(inputs=triton_request().inputs).SerializeToString(),
            id="a buffer before the inputs",
        ),
        pytest.param(
            triton_request().SerializeToString() + b"\xa0\x01\x05", id="an unknown field after"
        ),
        pytest.param(b"\x08\x01" + triton_request().SerializeToString(), id="a varint field"),
        pytest.param(triton_request().SerializeToString()[:-3], id="cut short"),
        pytest.param(b"", id="empty"),
    ],
)
def test_other_shapes_are_left_to_the_protobuf_path(data: bytes) -> None:
    assert decode_serialized(data) is None


def test_a_buffer_of_the_wrong_size_is_refused_in_the_full_decoder_s_words() -> None:
    message = triton_request()
    message.raw_input_contents[0] = b"\0" * 12
    with pytest.raises(InvalidInputError) as planned:
        decode_serialized(message.SerializeToString())
    with pytest.raises(InvalidInputError) as full:
        decode_infer_request(message)
    assert planned.value.message == full.value.message
    assert "input 'INPUT0': binary data is 12 bytes" in planned.value.message


def test_an_input_over_the_limits_is_refused_before_it_is_read() -> None:
    limits = TensorLimits(max_bytes=8, max_bytes_elements=2)
    data = triton_request().SerializeToString()
    with pytest.raises(PayloadTooLargeError) as planned:
        decode_serialized(data, limits=limits)
    with pytest.raises(PayloadTooLargeError) as full:
        decode_infer_request(triton_request(), limits=limits)
    assert planned.value.message == full.value.message


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x3a\x00" * (1 << 20), id="a million empty raw buffers"),
        pytest.param(b"\x0a\x00" * (1 << 20), id="a million empty model names"),
        pytest.param(
            triton_request().SerializeToString() + b"\x3a\x00" * (1 << 20),
            id="a planned description and a million raw buffers",
        ),
    ],
)
def test_a_message_of_many_tiny_fields_is_declined_after_bounded_work(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: the scan walked every field of a 2 MiB message on the event loop (8 s
    and 800 MiB for 8 MiB of empty raw buffers). Now the work stops at the description's cap
    (4 KiB) or the plan's count of inputs; the full parse decides about the rest."""
    fields = 0
    field_end = grpc_wire._field_end

    def counted(data: bytes, pos: int, size: int) -> int:
        nonlocal fields
        fields += 1
        return field_end(data, pos, size)

    monkeypatch.setattr(grpc_wire, "_field_end", counted)
    decode_serialized(triton_request().SerializeToString())  # the plan is known and recent
    fields = 0
    assert decode_serialized(data) is None
    assert fields <= 4096


def test_a_request_without_inputs_is_decoded_for_the_signature_to_judge() -> None:
    # All of a model's inputs may be optional (Triton serves such a request).
    message = pb.ModelInferRequest(model_name="m")
    assert decode_serialized(message.SerializeToString()) is None  # the full decoder's
    assert decode_infer_request(message).inputs == ()


def test_response_parameters_go_out_on_both_encoders() -> None:
    data = np.ones((1, 2), dtype=np.float32)
    params = {"sequence_id": 7, "sequence_end": True, "score": 0.5, "tag": "t"}
    response = InferResponse("m", "1", (OutputTensor("out", "FP32", data),), None, params)

    fast = pb.ModelInferResponse.FromString(grpc_wire.encode_serialized(response))
    full = encode_infer_response(response)

    assert fast == full
    assert full.parameters["sequence_id"].int64_param == 7
    assert full.parameters["sequence_end"].bool_param is True
    assert full.parameters["score"].double_param == 0.5
    assert full.parameters["tag"].string_param == "t"
