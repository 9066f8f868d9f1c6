"""The HTTP infer body decoder (JSON and the binary tensor extension) on hostile bodies.

Property: whatever the bytes and the Inference-Header-Content-Length, `decode_infer_request`
returns a request whose tensors have the declared shapes, or raises `InvalidInputError` (HTTP 400
with its message). Anything else would be a 500 for a client's mistake.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.http.codec import decode_infer_request
from agent.errors import InvalidInputError, PayloadTooLargeError
from agent.tensors.limits import TensorLimits
from agent.tensors.request import InferRequest
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import DATATYPES, DIMS, JSON, assert_reason, nested


def _decoded_or_refused(
    body: bytes, header_length: int | None, limits: TensorLimits | None = None
) -> InferRequest | None:
    try:
        request = decode_infer_request(body, header_length, limits=limits)
    except (InvalidInputError, PayloadTooLargeError) as exc:
        assert_reason(exc)
        return None
    for tensor in request.inputs:
        if tensor.shm is None:
            assert tensor.data.shape == tensor.shape
    return request


@st.composite
def _input(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": draw(st.sampled_from(["INPUT0", "INPUT1", ""]) | JSON),
        "datatype": draw(st.sampled_from([*DATATYPES, "FP8", "fp32"]) | JSON),
        "shape": draw(st.lists(DIMS, max_size=4) | JSON),
    }
    if draw(st.booleans()):
        entry["data"] = draw(JSON | st.lists(st.integers(-300, 300), max_size=8))
    if draw(st.booleans()):
        size = draw(st.integers(-2, 64) | st.sampled_from([2**31, 2**63, 2**64]) | JSON)
        entry["parameters"] = {"binary_data_size": size}
    elif draw(st.booleans()):
        entry["parameters"] = draw(JSON)
    for key in draw(st.lists(st.sampled_from(list(entry)), max_size=2)):
        entry.pop(key, None)
    return entry


@st.composite
def _binary_body(draw: st.DrawFn) -> tuple[bytes, int | None]:
    doc: dict[str, Any] = {"inputs": draw(st.lists(_input(), max_size=3))}
    if draw(st.booleans()):
        doc["outputs"] = draw(JSON | st.lists(st.fixed_dictionaries({"name": st.text(max_size=4)})))
    if draw(st.booleans()):
        doc["parameters"] = draw(JSON)
    if draw(st.booleans()):
        doc["id"] = draw(JSON)
    header = json.dumps(doc).encode()
    tail = draw(st.binary(max_size=64))
    length = draw(
        st.sampled_from([len(header), None])
        | st.integers(-1, len(header) + len(tail) + 1)
        | st.sampled_from([2**63, -(2**63)])
    )
    return header + tail, length


@FUZZ
@given(st.binary(max_size=256), st.none() | st.integers(-(2**64), 2**64))
def test_any_bytes_decode_or_are_refused(body: bytes, header_length: int | None) -> None:
    _decoded_or_refused(body, header_length)


@FUZZ
@given(_binary_body())
# Found by this test: a zero-element tensor with a huge dimension, JSON and binary.
@example(
    (b'{"inputs":[{"name":"a","datatype":"FP32","shape":[0,4611686018427387904],"data":[]}]}', None)
)
@example(
    (
        b'{"inputs":[{"name":"a","datatype":"FP32","shape":[0,1180591620717411303424],'
        b'"parameters":{"binary_data_size":0}}]}',
        None,
    )
)
def test_tensor_headers_decode_or_are_refused(case: tuple[bytes, int | None]) -> None:
    body, header_length = case
    _decoded_or_refused(body, header_length)
    if header_length is not None and 0 <= header_length <= len(body):
        _decoded_or_refused(body, header_length)  # the second time through the header cache
    _decoded_or_refused(body, header_length, TensorLimits(max_bytes=64, max_bytes_elements=4))


@FUZZ
@given(
    st.sampled_from(DATATYPES),
    st.lists(st.integers(0, 3), max_size=3),
    st.binary(max_size=40),
)
def test_binary_data_of_any_length_decodes_or_is_refused(
    datatype: str, shape: list[int], raw: bytes
) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    request = _decoded_or_refused(header + raw, len(header))
    if request is not None and datatype != "BYTES":
        assert request.inputs[0].data.tobytes() == raw


def test_deeply_nested_json_is_refused_not_a_recursion_error() -> None:
    """Found by fuzzing: json.loads raised RecursionError on deep nesting (a 500)."""
    for body in (nested(100_000).encode(), b'{"inputs":' + nested(100_000).encode() + b"}"):
        for header_length in (None, len(body)):
            _decoded_or_refused(body, header_length)


def test_deeply_nested_data_is_refused() -> None:
    data = nested(900)
    doc = f'{{"inputs":[{{"name":"a","datatype":"FP32","shape":[1],"data":{data}}}]}}'
    assert _decoded_or_refused(doc.encode(), None) is None


def test_a_rank_numpy_cannot_hold_is_refused() -> None:
    """Found by fuzzing: numpy refuses more than 32 (numpy 1) or 64 (numpy 2) dimensions."""
    doc = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1] * 70, "data": [1.0]}]}
    assert _decoded_or_refused(json.dumps(doc).encode(), None) is None


def test_bytes_elements_decode_back() -> None:
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b""))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    request = _decoded_or_refused(header + raw, len(header))
    assert request is not None
    assert list(request.inputs[0].data) == [b"ab", b""]
    assert np.array_equal(request.inputs[0].data, np.array([b"ab", b""], dtype=object))
