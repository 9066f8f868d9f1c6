"""KServe v2 request/response codec: JSON, the binary tensor extension, and malformed bodies."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from agent.api.http.codec import decode_infer_request, encode_infer_response
from agent.errors import InvalidInputError
from agent.tensors.request import (
    InferInput,
    InferRequest,
    InferResponse,
    OutputTensor,
    RequestedOutput,
    tensor_from_bytes,
    tensor_to_bytes,
)

# One sample per datatype, shape [2, 2], with values at the edges of each type's range.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False], [False, True]], dtype=np.bool_),
    "UINT8": np.array([[0, 1], [128, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 1], [300, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 1], [70000, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 1], [2**40, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, -1], [0, 127]], dtype=np.int8),
    "INT16": np.array([[-32768, -1], [0, 32767]], dtype=np.int16),
    "INT32": np.array([[-(2**31), -1], [0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), -1], [0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.5], [0.0, 1024.0]], dtype=np.float16),
    "FP32": np.array([[0.25, -1.5], [3.0e10, 1.0e-3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5], [1.0e300, 2.5e-300]], dtype=np.float64),
    "BYTES": np.array([[b"abc", b""], [b"\xe2\x82\xac", b"a longer element"]], dtype=np.object_),
}
DATATYPES = list(SAMPLES)


def body_of(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def binary_body(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    """A binary-extension body: the JSON header, then the raw chunks; and the header's length."""
    header = json.dumps(doc).encode()
    return header + b"".join(chunks), len(header)


def one_input(**fields: Any) -> dict[str, Any]:
    """A request document with one input; `fields` override the defaults of a valid FP32 [2]."""
    tensor: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    tensor.update(fields)
    return {"inputs": [tensor]}


def json_value(item: Any) -> Any:
    """How a sample's element is written in KServe JSON."""
    return item.decode() if isinstance(item, bytes) else item.item()


def split_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return json.loads(body), b""
    return json.loads(body[:header_length]), body[header_length:]


def make_request(
    outputs: tuple[RequestedOutput, ...] | None = None, binary_output: bool = False
) -> InferRequest:
    data = np.zeros(1, dtype=np.float32)
    return InferRequest(
        inputs=(InferInput("x", "FP32", (1,), data),), outputs=outputs, binary_output=binary_output
    )


# --- decoding: JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_decode_json_flat_data_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    flat = [json_value(v) for v in sample.ravel()]
    doc = {"inputs": [{"name": "t", "datatype": datatype, "shape": [2, 2], "data": flat}]}

    request = decode_infer_request(body_of(doc))

    (tensor,) = request.inputs
    assert tensor.name == "t"
    assert tensor.datatype == datatype
    assert tensor.shape == (2, 2)
    assert tensor.data.shape == (2, 2)
    assert tensor.data.dtype == sample.dtype
    assert tensor.data.tolist() == sample.tolist()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_decode_json_nested_data_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    nested = [[json_value(v) for v in row] for row in sample]
    doc = {"inputs": [{"name": "t", "datatype": datatype, "shape": [2, 2], "data": nested}]}

    (tensor,) = decode_infer_request(body_of(doc)).inputs

    assert tensor.data.dtype == sample.dtype
    assert tensor.data.tolist() == sample.tolist()


def test_decode_json_nested_data_takes_the_declared_shape() -> None:
    doc = {
        "inputs": [
            {"name": "t", "datatype": "INT32", "shape": [3, 2], "data": [[1, 2, 3], [4, 5, 6]]}
        ]
    }

    (tensor,) = decode_infer_request(body_of(doc)).inputs

    assert tensor.data.shape == (3, 2)
    assert tensor.data.tolist() == [[1, 2], [3, 4], [5, 6]]


def test_decode_json_scalar_and_empty_tensors() -> None:
    doc = {
        "inputs": [
            {"name": "scalar", "datatype": "FP32", "shape": [], "data": [3.5]},
            {"name": "empty", "datatype": "INT64", "shape": [0, 4], "data": []},
        ]
    }

    scalar, empty = decode_infer_request(body_of(doc)).inputs

    assert scalar.data.shape == ()
    assert float(scalar.data) == 3.5
    assert empty.data.shape == (0, 4)
    assert empty.data.dtype == np.int64


def test_decode_json_keeps_inputs_in_order() -> None:
    doc = {
        "inputs": [
            {"name": "b", "datatype": "INT8", "shape": [1], "data": [1]},
            {"name": "a", "datatype": "INT8", "shape": [1], "data": [2]},
        ]
    }

    request = decode_infer_request(body_of(doc))

    assert [t.name for t in request.inputs] == ["b", "a"]


def test_decode_request_defaults() -> None:
    request = decode_infer_request(body_of(one_input()))

    assert request.id is None
    assert request.outputs is None
    assert request.binary_output is False
    assert dict(request.parameters) == {}


def test_decode_request_id_and_parameters() -> None:
    doc = one_input()
    doc["id"] = "req-42"
    doc["parameters"] = {"binary_data_output": True, "custom": "x"}

    request = decode_infer_request(body_of(doc))

    assert request.id == "req-42"
    assert request.binary_output is True
    assert request.parameters["custom"] == "x"


def test_decode_requested_outputs_with_per_output_binary_data() -> None:
    doc = one_input()
    doc["outputs"] = [
        {"name": "plain"},
        {"name": "bin", "parameters": {"binary_data": True}},
        {"name": "json", "parameters": {"binary_data": False}},
    ]

    request = decode_infer_request(body_of(doc))

    assert request.outputs == (
        RequestedOutput("plain", None),
        RequestedOutput("bin", True),
        RequestedOutput("json", False),
    )


def test_decode_empty_outputs_list_is_an_empty_selection() -> None:
    doc = one_input()
    doc["outputs"] = []

    assert decode_infer_request(body_of(doc)).outputs == ()


def test_decode_empty_inputs_list_is_a_request_without_inputs() -> None:
    # A model whose inputs are all optional serves it (Triton too); the signature refuses it
    # for a model with a required input.
    assert decode_infer_request(body_of({"inputs": []})).inputs == ()


# --- decoding: binary extension -----------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_decode_binary_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    raw = tensor_to_bytes(sample, datatype)
    doc = {
        "inputs": [
            {
                "name": "t",
                "datatype": datatype,
                "shape": [2, 2],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    body, header_length = binary_body(doc, raw)

    (tensor,) = decode_infer_request(body, header_length).inputs

    assert tensor.data.shape == (2, 2)
    assert tensor.data.dtype == sample.dtype
    assert tensor.data.tolist() == sample.tolist()


def test_binary_layout_is_little_endian_row_major() -> None:
    data = np.array([[1, 2], [3, 256]], dtype=np.int32)

    raw = tensor_to_bytes(data, "INT32")

    assert raw == struct.pack("<4i", 1, 2, 3, 256)


def test_binary_bytes_layout_is_length_prefixed() -> None:
    data = np.array([b"ab", b"", b"xyz"], dtype=np.object_)

    raw = tensor_to_bytes(data, "BYTES")

    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00xyz"
    assert tensor_from_bytes(raw, "BYTES", [3]).tolist() == [b"ab", b"", b"xyz"]


def test_tensor_to_bytes_encodes_str_elements_as_utf8() -> None:
    data = np.array(["é"], dtype=np.object_)

    assert tensor_to_bytes(data, "BYTES") == b"\x02\x00\x00\x00\xc3\xa9"


def test_decode_binary_and_json_inputs_mixed() -> None:
    first = np.array([1.5, 2.5], dtype=np.float32)
    second = np.array([b"hi", b"there"], dtype=np.object_)
    raw1, raw2 = tensor_to_bytes(first, "FP32"), tensor_to_bytes(second, "BYTES")
    doc = {
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [2],
                "parameters": {"binary_data_size": len(raw1)},
            },
            {"name": "j", "datatype": "INT32", "shape": [1], "data": [7]},
            {
                "name": "b",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": len(raw2)},
            },
        ]
    }
    body, header_length = binary_body(doc, raw1, raw2)

    a, j, b = decode_infer_request(body, header_length).inputs

    assert a.data.tolist() == [1.5, 2.5]
    assert j.data.tolist() == [7]
    assert b.data.tolist() == [b"hi", b"there"]


def test_decode_header_length_equal_to_body_is_plain_json() -> None:
    body = body_of(one_input())

    request = decode_infer_request(body, len(body))

    assert request.inputs[0].data.tolist() == [1.0, 2.0]


def test_decode_binary_zero_size_tensor() -> None:
    doc = {
        "inputs": [
            {
                "name": "t",
                "datatype": "FP32",
                "shape": [0, 3],
                "parameters": {"binary_data_size": 0},
            }
        ]
    }
    body, header_length = binary_body(doc)

    (tensor,) = decode_infer_request(body, header_length).inputs

    assert tensor.data.shape == (0, 3)


# --- encoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_encode_json_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    response = InferResponse("m", "1", (OutputTensor("out", datatype, sample),))

    body, header_length = encode_infer_response(response, make_request())

    assert header_length is None
    doc = json.loads(body)
    (out,) = doc["outputs"]
    assert out == {
        "name": "out",
        "datatype": datatype,
        "shape": [2, 2],
        "data": [json_value(v) for v in sample.ravel()],
    }


@pytest.mark.parametrize("datatype", DATATYPES)
def test_encode_binary_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    response = InferResponse("m", "1", (OutputTensor("out", datatype, sample),))

    body, header_length = encode_infer_response(response, make_request(binary_output=True))

    assert header_length is not None
    doc, raw = split_response(body, header_length)
    (out,) = doc["outputs"]
    assert "data" not in out
    assert out["parameters"] == {"binary_data_size": len(raw)}
    assert out["shape"] == [2, 2]
    assert tensor_from_bytes(raw, datatype, out["shape"]).tolist() == sample.tolist()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_request_to_response_round_trip_every_datatype(datatype: str) -> None:
    sample = SAMPLES[datatype]
    raw = tensor_to_bytes(sample, datatype)
    doc = {
        "id": "rt",
        "inputs": [
            {
                "name": "t",
                "datatype": datatype,
                "shape": [2, 2],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, header_length = binary_body(doc, raw)
    request = decode_infer_request(body, header_length)
    (tensor,) = request.inputs
    response = InferResponse("m", "1", (OutputTensor("t", datatype, tensor.data),), request.id)

    out_body, out_length = encode_infer_response(response, request)

    assert out_length is not None
    out_doc, out_raw = split_response(out_body, out_length)
    assert out_doc["id"] == "rt"
    assert out_raw == raw


def test_encode_echoes_request_id() -> None:
    doc = one_input()
    doc["id"] = "abc-123"
    request = decode_infer_request(body_of(doc))
    response = InferResponse("model", "3", (), request.id)

    body, _ = encode_infer_response(response, request)

    assert json.loads(body) == {
        "model_name": "model",
        "model_version": "3",
        "id": "abc-123",
        "outputs": [],
    }


def test_encode_without_id_leaves_it_out() -> None:
    response = InferResponse("model", "1", ())

    body, _ = encode_infer_response(response, make_request())

    assert "id" not in json.loads(body)


def three_outputs() -> InferResponse:
    return InferResponse(
        "m",
        "1",
        (
            OutputTensor("a", "INT32", np.array([1, 2], dtype=np.int32)),
            OutputTensor("b", "FP32", np.array([0.5], dtype=np.float32)),
            OutputTensor("c", "BYTES", np.array([b"x"], dtype=np.object_)),
        ),
    )


def test_encode_per_output_binary_data_overrides_request_default() -> None:
    request = make_request(
        outputs=(RequestedOutput("a", True), RequestedOutput("b"), RequestedOutput("c", True)),
        binary_output=False,
    )

    body, header_length = encode_infer_response(three_outputs(), request)

    doc, raw = split_response(body, header_length)
    a, b, c = doc["outputs"]
    assert a["parameters"] == {"binary_data_size": 8}
    assert "data" not in a
    assert b["data"] == [0.5]
    assert "parameters" not in b
    assert c["parameters"] == {"binary_data_size": 5}
    assert raw == struct.pack("<2i", 1, 2) + b"\x01\x00\x00\x00x"


def test_encode_request_level_binary_output_with_a_json_exception() -> None:
    request = make_request(
        outputs=(RequestedOutput("a"), RequestedOutput("b", False), RequestedOutput("c")),
        binary_output=True,
    )

    body, header_length = encode_infer_response(three_outputs(), request)

    doc, raw = split_response(body, header_length)
    a, b, c = doc["outputs"]
    assert a["parameters"]["binary_data_size"] == 8
    assert b["data"] == [0.5]
    assert c["parameters"]["binary_data_size"] == 5
    assert len(raw) == 13


def test_encode_header_length_points_at_end_of_json() -> None:
    response = InferResponse("m", "1", (OutputTensor("a", "UINT8", np.array([7], np.uint8)),))

    body, header_length = encode_infer_response(response, make_request(binary_output=True))

    assert header_length is not None
    assert body[header_length:] == b"\x07"
    assert json.loads(body[:header_length])["outputs"][0]["parameters"] == {"binary_data_size": 1}


def test_encode_non_utf8_bytes_as_json_is_refused() -> None:
    response = InferResponse(
        "m", "1", (OutputTensor("raw", "BYTES", np.array([b"\xff\xfe"], np.object_)),)
    )

    with pytest.raises(InvalidInputError, match=r"output 'raw' is not UTF-8.*binary_data"):
        encode_infer_response(response, make_request())


def test_encode_non_utf8_bytes_as_binary_is_fine() -> None:
    response = InferResponse(
        "m", "1", (OutputTensor("raw", "BYTES", np.array([b"\xff\xfe"], np.object_)),)
    )

    body, header_length = encode_infer_response(response, make_request(binary_output=True))

    assert body[header_length:] == b"\x02\x00\x00\x00\xff\xfe"


# --- malformed requests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "malformed JSON"),
        (b"\xff\xfe", "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"{}", "must have an 'inputs' list"),
        (b'{"inputs": {"name": "x"}}', "must have an 'inputs' list"),
        (b'{"inputs": ["x"]}', "each input must be a JSON object"),
    ],
)
def test_malformed_body(body: bytes, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        decode_infer_request(body)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": ""}, "must have a 'name'"),
        ({"name": 5}, "must have a 'name'"),
        ({"datatype": "FLOAT32"}, r"invalid datatype for input x: 'FLOAT32'"),
        ({"datatype": "BF16"}, r"invalid datatype for input x: 'BF16'"),
        ({"datatype": None}, r"invalid datatype for input x: None"),
        ({"shape": [-1]}, r"input 'x' must have a 'shape' of non-negative integers"),
        ({"shape": [2, -3]}, "non-negative integers"),
        ({"shape": [2.0]}, "non-negative integers"),
        ({"shape": [True, True]}, "non-negative integers"),
        ({"shape": "2"}, "non-negative integers"),
        ({"shape": [3]}, r"input 'x' has 2 elements but shape \[3\] needs 3"),
        ({"shape": [1]}, r"has 2 elements but shape \[1\] needs 1"),
        ({"data": 5}, r"input 'x': 'data' must be a list"),
        ({"data": [1.0, "abc"]}, r"input 'x': FP32 data must be numbers"),
        ({"data": [[1.0], [2.0, 3.0]]}, "data does not fit FP32"),
        ({"datatype": "UINT8", "data": [1, 256]}, "outside the range of UINT8"),
        ({"datatype": "INT8", "data": [1, -129]}, "outside the range of INT8"),
        ({"datatype": "BOOL", "data": [1, 0]}, "BOOL data must be true or false"),
        ({"datatype": "BYTES", "data": ["a", 1]}, "BYTES data must be strings"),
        ({"parameters": []}, r"'parameters' of input 'x' must be an object"),
    ],
)
def test_malformed_input(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        decode_infer_request(body_of(one_input(**fields)))


def test_input_without_data() -> None:
    doc = one_input()
    del doc["inputs"][0]["data"]

    with pytest.raises(
        InvalidInputError, match="input 'x' has neither 'data' nor binary_data_size"
    ):
        decode_infer_request(body_of(doc))


@pytest.mark.parametrize(
    ("value", "datatype"),
    [
        pytest.param(1.7, "INT32", id="float-into-int32"),
        pytest.param(True, "INT64", id="bool-into-int64"),
        pytest.param("1.5", "FP32", id="string-into-fp32"),
        pytest.param(None, "FP64", id="null-into-fp64"),
    ],
)
def test_json_element_of_the_wrong_kind_is_refused(value: Any, datatype: str) -> None:
    doc = one_input(datatype=datatype, shape=[2], data=[1, value])

    with pytest.raises(InvalidInputError, match="input 'x'"):
        decode_infer_request(body_of(doc))


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"id": 5}, "'id' must be a string"),
        ({"parameters": "x"}, "'parameters' of request must be an object"),
        ({"parameters": {"binary_data_output": "true"}}, "'binary_data_output' must be a boolean"),
        ({"parameters": {"binary_data_output": 1}}, "'binary_data_output' must be a boolean"),
        ({"outputs": {"name": "y"}}, "'outputs' must be a list"),
        ({"outputs": [{"nom": "y"}]}, "each requested output must be an object with a 'name'"),
        ({"outputs": ["y"]}, "each requested output must be an object with a 'name'"),
        (
            {"outputs": [{"name": "y", "parameters": {"classification": 0}}]},
            "output 'y': classification must be a positive integer",
        ),
        (
            {"outputs": [{"name": "y", "parameters": {"classification": "3"}}]},
            "output 'y': classification must be a positive integer",
        ),
        (
            {"outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]},
            "output 'y': binary_data must be a boolean",
        ),
        (
            {"outputs": [{"name": "y", "parameters": {"binary_data": 1}}]},
            "output 'y': binary_data must be a boolean",
        ),
        (
            {"outputs": [{"name": "y", "parameters": 1}]},
            "'parameters' of output 'y' must be an object",
        ),
    ],
)
def test_malformed_request_fields(doc: dict[str, Any], match: str) -> None:
    full = one_input()
    full.update(doc)

    with pytest.raises(InvalidInputError, match=match):
        decode_infer_request(body_of(full))


def fp32_binary_doc(size: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [2],
                "parameters": {"binary_data_size": size},
            }
        ]
    }


def test_binary_size_mismatch_with_shape() -> None:
    body, header_length = binary_body(fp32_binary_doc(4), b"\x00" * 4)

    with pytest.raises(
        InvalidInputError,
        match=r"input 'x': binary data is 4 bytes but shape \[2\] of FP32 needs 8",
    ):
        decode_infer_request(body, header_length)


def test_binary_size_past_end_of_body() -> None:
    body, header_length = binary_body(fp32_binary_doc(8), b"\x00" * 7)

    with pytest.raises(
        InvalidInputError, match="input 'x': binary_data_size 8 runs past the end of the body"
    ):
        decode_infer_request(body, header_length)


def test_binary_leftover_bytes() -> None:
    body, header_length = binary_body(fp32_binary_doc(8), b"\x00" * 9)

    with pytest.raises(
        InvalidInputError, match=r"binary tensor data is 9 bytes but .* add up to 8"
    ):
        decode_infer_request(body, header_length)


def test_binary_bytes_after_a_json_only_request() -> None:
    body, header_length = binary_body(one_input(), b"junk")

    with pytest.raises(InvalidInputError, match=r"binary tensor data is 4 bytes .* add up to 0"):
        decode_infer_request(body, header_length)


def test_binary_data_without_header_length() -> None:
    body, _ = binary_body(fp32_binary_doc(8), b"\x00" * 8)

    with pytest.raises(InvalidInputError, match="malformed JSON"):
        decode_infer_request(body)


def test_binary_data_size_declared_but_no_header_length() -> None:
    body = body_of(fp32_binary_doc(8))

    with pytest.raises(InvalidInputError, match="binary_data_size 8 runs past the end"):
        decode_infer_request(body)


@pytest.mark.parametrize("size", [-1, 1.5, "8", True])
def test_binary_data_size_must_be_a_non_negative_int(size: Any) -> None:
    body, header_length = binary_body(fp32_binary_doc(size), b"\x00" * 8)

    with pytest.raises(
        InvalidInputError, match="input 'x': binary_data_size must be a non-negative int"
    ):
        decode_infer_request(body, header_length)


def test_binary_data_size_and_data_both_given() -> None:
    doc = one_input(parameters={"binary_data_size": 8})
    body, header_length = binary_body(doc, b"\x00" * 8)

    with pytest.raises(InvalidInputError, match="input 'x' has both 'data' and binary_data_size"):
        decode_infer_request(body, header_length)


def test_header_length_larger_than_body() -> None:
    body = body_of(one_input())

    with pytest.raises(
        InvalidInputError,
        match=f"Inference-Header-Content-Length is {len(body) + 1} but the body "
        f"has only {len(body)} bytes",
    ):
        decode_infer_request(body, len(body) + 1)


def test_negative_header_length() -> None:
    with pytest.raises(
        InvalidInputError, match="Inference-Header-Content-Length must not be negative"
    ):
        decode_infer_request(body_of(one_input()), -1)


def test_header_length_cutting_the_json_short() -> None:
    body = body_of(one_input())

    with pytest.raises(InvalidInputError, match="malformed JSON"):
        decode_infer_request(body, len(body) - 1)


def bytes_doc(size: int) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "s",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": size},
            }
        ]
    }


def test_bytes_element_running_past_end() -> None:
    raw = b"\x01\x00\x00\x00a" + b"\x05\x00\x00\x00ab"
    body, header_length = binary_body(bytes_doc(len(raw)), raw)

    with pytest.raises(
        InvalidInputError, match="input 's': BYTES tensor element runs past the end of its data"
    ):
        decode_infer_request(body, header_length)


def test_bytes_ending_inside_a_length_prefix() -> None:
    raw = b"\x01\x00\x00\x00a" + b"\x01\x00"
    body, header_length = binary_body(bytes_doc(len(raw)), raw)

    with pytest.raises(
        InvalidInputError, match="input 's': BYTES tensor ends inside an element's length prefix"
    ):
        decode_infer_request(body, header_length)


def test_bytes_element_count_mismatch() -> None:
    raw = b"\x01\x00\x00\x00a"
    body, header_length = binary_body(bytes_doc(len(raw)), raw)

    with pytest.raises(
        InvalidInputError, match=r"input 's': BYTES tensor holds 1 elements but shape \[2\] needs 2"
    ):
        decode_infer_request(body, header_length)


def test_tensor_from_bytes_size_mismatch() -> None:
    with pytest.raises(InvalidInputError, match=r"binary data is 3 bytes .* INT16 needs 4"):
        tensor_from_bytes(b"\x00\x00\x00", "INT16", [2])


def test_requests_sharing_a_binary_header_each_get_their_own_tensors() -> None:
    doc = {
        "id": "same",
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"binary_data_size": 8},
            },
            {"name": "b", "datatype": "INT8", "shape": [3], "parameters": {"binary_data_size": 3}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        "parameters": {"priority": 1},
    }
    decoded = []
    for seed in range(3):
        a = np.array([[seed, -seed]], dtype=np.float32)
        b = np.array([seed, seed + 1, 7], dtype=np.int8)
        body, length = binary_body(doc, a.tobytes(), b.tobytes())
        decoded.append((decode_infer_request(body, length), a, b))
    for request, a, b in decoded:
        np.testing.assert_array_equal(request.inputs[0].data, a)
        np.testing.assert_array_equal(request.inputs[1].data, b)
        assert request.id == "same"
        assert request.outputs == (RequestedOutput("y", True),)
        assert dict(request.parameters) == {"priority": 1}


def test_a_repeated_binary_header_still_checks_each_body_length() -> None:
    doc = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
        ]
    }
    body, length = binary_body(doc, bytes(8))
    assert decode_infer_request(body, length).inputs[0].data.shape == (2,)
    with pytest.raises(InvalidInputError, match="runs past the end of the body"):
        decode_infer_request(body[:-1], length)
    with pytest.raises(InvalidInputError, match="add up to 8"):
        decode_infer_request(body + b"\0", length)


def test_a_repeated_invalid_binary_header_keeps_its_error() -> None:
    def doc(shape: int, **extra: Any) -> dict[str, Any]:
        tensor = {"name": "a", "datatype": "FP32", "shape": [shape]}
        return {"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}], **extra}

    body, length = binary_body(doc(3), bytes(8))
    for _ in range(2):
        with pytest.raises(InvalidInputError, match="binary data is 8 bytes but shape"):
            decode_infer_request(body, length)
    body, length = binary_body(doc(2, id=5), bytes(8))
    for _ in range(2):
        with pytest.raises(InvalidInputError, match="'id' must be a string"):
            decode_infer_request(body, length)


def test_binary_responses_of_one_shape_carry_their_own_id_and_data() -> None:
    request = InferRequest(inputs=(), binary_output=True)
    seen = []
    for request_id, value in (("r1", 1.0), (None, 2.0), ("r1", 3.0)):
        data = np.full((1, 3), value, dtype=np.float32)
        response = InferResponse("m", "1", (OutputTensor("y", "FP32", data),), request_id)
        payload, length = encode_infer_response(response, request)
        assert length is not None
        header = json.loads(payload[:length])
        assert header.get("id") == request_id
        assert header["outputs"] == [
            {
                "name": "y",
                "datatype": "FP32",
                "shape": [1, 3],
                "parameters": {"binary_data_size": 12},
            }
        ]
        seen.append(np.frombuffer(payload[length:], dtype=np.float32))
    assert [float(v[0]) for v in seen] == [1.0, 2.0, 3.0]


def test_a_response_without_outputs_is_plain_json() -> None:
    request = InferRequest(inputs=(), binary_output=True)
    payload, length = encode_infer_response(InferResponse("m", "1", ()), request)
    assert length is None
    assert json.loads(payload) == {"model_name": "m", "model_version": "1", "outputs": []}


def test_an_output_asked_as_its_top_classes_carries_the_count() -> None:
    full = one_input()
    full["outputs"] = [{"name": "y", "parameters": {"classification": 3}}, {"name": "z"}]

    request = decode_infer_request(body_of(full))

    assert request.outputs is not None
    assert [o.classification for o in request.outputs] == [3, None]


@pytest.mark.parametrize("binary_output", [False, True])
def test_response_parameters_are_encoded_after_the_version(binary_output: bool) -> None:
    data = np.ones((1, 2), dtype=np.float32)
    params = {"sequence_id": 0, "sequence_start": False, "note": "x"}
    response = InferResponse("m", "1", (OutputTensor("out", "FP32", data),), "r", params)

    body, length = encode_infer_response(response, make_request(binary_output=binary_output))

    doc = json.loads(body[:length] if length is not None else body)
    assert list(doc)[:4] == ["model_name", "model_version", "id", "parameters"]
    assert doc["parameters"] == params
