"""Large JSON infer bodies (`agent.api.http.json_spans`): bounded memory, and the same arrays or
the same errors as the plain path.

A body under `SPLICE_MIN_BYTES` takes the plain path; the same body with a padding key appended
(as the last key, so every position before it is unchanged) takes the spliced one.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.http.codec import decode_infer_request
from agent.api.http.json_spans import SPLICE_MIN_BYTES
from agent.errors import AgentError, PayloadTooLargeError
from agent.tensors.limits import TensorLimits
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import DATATYPES

_PAD = ',"~pad":"' + "x" * SPLICE_MIN_BYTES + '"}'


def _body(inputs: list[str], pad: bool) -> bytes:
    text = '{"inputs":[' + ",".join(inputs) + "]"
    return (text + (_PAD if pad else "}")).encode()


def _input(data: str, datatype: str = "FP32", shape: list[int] | None = None) -> str:
    head = {"name": "x", "datatype": datatype, "shape": shape if shape is not None else [1]}
    return json.dumps(head)[:-1] + ',"data":' + data + "}"


def _outcome(body: bytes, limits: TensorLimits | None = None) -> tuple[Any, ...]:
    try:
        request = decode_infer_request(body, limits=limits)
    except AgentError as exc:
        return type(exc).__name__, exc.message
    result: list[Any] = []
    for tensor in request.inputs:
        data = tensor.data
        raw = data.tolist() if data.dtype == object else data.tobytes()
        result.append((tensor.name, tensor.datatype, data.dtype.str, data.shape, raw))
    return ("ok", *result)


def _same(inputs: list[str], limits: TensorLimits | None = None) -> tuple[Any, ...]:
    plain = _outcome(_body(inputs, pad=False), limits)
    spliced = _outcome(_body(inputs, pad=True), limits)
    assert spliced == plain
    return plain


# --- memory ----------------------------------------------------------------------------------


def _peak(body: bytes, limits: TensorLimits | None = None) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        try:
            result: Any = decode_infer_request(body, limits=limits)
        except AgentError as exc:
            result = exc
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_a_large_fp32_body_decodes_within_three_times_its_size() -> None:
    token = b"0.123456789,"
    count = 24 * 1024 * 1024 // len(token)  # a 24 MiB body
    data = b"[" + token * (count - 1) + b"0.5]"
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,%d],"data":%s}]}' % (count, data)
    del data
    peak, request = _peak(body, TensorLimits(64 * 1024 * 1024))
    assert request.inputs[0].data.shape == (1, count)
    assert request.inputs[0].data[0, -1] == np.float32(0.5)
    assert request.inputs[0].data[0, 0] == np.float32(0.123456789)
    assert peak + len(body) <= 3 * len(body), f"{(peak + len(body)) / len(body):.2f}x the body"


def test_a_nested_large_body_decodes_within_three_times_its_size() -> None:
    row = b"[" + b",".join([b"-1.5e-3"] * 1000) + b"]"
    data = b"[" + b",".join([row] * 2500) + b"]"  # about 20 MiB
    body = b'{"inputs":[{"name":"x","datatype":"FP64","shape":[2500,1000],"data":%s}]}' % data
    del data, row
    peak, request = _peak(body)
    assert request.inputs[0].data.shape == (2500, 1000)
    assert np.all(request.inputs[0].data == -1.5e-3)
    assert peak + len(body) <= 3 * len(body), f"{(peak + len(body)) / len(body):.2f}x the body"


def test_a_shape_over_the_limit_is_refused_before_its_data_is_parsed() -> None:
    count = 10 * 1024 * 1024
    data = b"[" + b"0," * (count - 1) + b"0]"  # 20 MiB of text, 40 MiB as FP32
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d],"data":%s}]}' % (count, data)
    del data
    peak, error = _peak(body, TensorLimits(16 * 1024 * 1024))
    assert isinstance(error, PayloadTooLargeError)
    assert peak < len(body) // 4


# --- the same answers as the plain path --------------------------------------------------------

_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-300, 300).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.floats(width=32).map(json.dumps),
    st.sampled_from(
        [
            "-0", "-0.0", "0", "1E5", "1e-05", "2.5E+3", "1e400", "-1e400", "4.9e-325",
            "127", "128", "255", "256", "-129", "32768", "65536", "4294967296", "16777217",
            "9007199254740993", "9223372036854775807", "9223372036854775808",
            "18446744073709551615", "18446744073709551616", "-9223372036854775809",
        ]
    ),
)  # fmt: skip
_ODD = st.sampled_from(
    ["true", "false", "null", '"a"', "NaN", "-Infinity", "[]", "{}", "[1]", "01", "1.", ".5",
     "+1", "1e", "--1", "-", "1 2", "0x10", "1,,2", ""]
)  # fmt: skip
_SEPARATORS = st.sampled_from([",", ", ", " ,\n\t", "\r\n,"])


@st.composite
def _data(draw: st.DrawFn) -> tuple[str, int]:
    """A data array as text (flat, rectangular or ragged), and how many numbers it holds."""
    token = _NUMBERS | _ODD if draw(st.integers(0, 4)) == 0 else _NUMBERS
    sep = draw(_SEPARATORS)
    rows = draw(st.integers(0, 4))
    if rows == 0:
        items = draw(st.lists(token, max_size=8))
        return "[" + sep.join(items) + "]", len(items)
    width = draw(st.integers(0, 4))
    lengths = [width] * rows
    if draw(st.integers(0, 3)) == 0:  # ragged
        lengths = draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
    inner = ["[" + sep.join(draw(st.lists(token, min_size=n, max_size=n))) + "]" for n in lengths]
    if draw(st.integers(0, 4)) == 0:
        inner = ["[" + row + "]" for row in inner]  # one more level
    return "[" + sep.join(inner) + "]", sum(lengths)


@FUZZ
@given(
    st.lists(
        st.tuples(_data(), st.sampled_from(DATATYPES), st.integers(-1, 1), st.booleans()),
        min_size=1,
        max_size=3,
    )
)
@example([(("[1, 2.5, -0, 3]", 4), "FP32", 0, False)])
@example([(("[[16777217, 1.0], [-0, 2]]", 4), "FP32", 0, True)])
@example([(("[[1,2],[3]]", 3), "INT32", 0, False)])
@example([(("[300, 1]", 2), "UINT8", 0, False)])
@example([(("[1.5, 2]", 2), "INT64", 0, False), (("[01]", 1), "FP32", 0, False)])
@example([(("[[],[]]", 0), "BOOL", 0, False)])
@example([(("[[1],[2]]", 2), "BYTES", 0, False)])
@example([(("[18446744073709551615, 1]", 2), "UINT64", 0, False)])
@example([(("[18446744073709551616, 1.5]", 2), "FP64", 0, False)])
def test_spliced_bodies_decode_as_plain_ones(
    cases: list[tuple[tuple[str, int], str, int, bool]],
) -> None:
    inputs = []
    for (data, count), datatype, off, nested in cases:
        n = max(count + off, 0)
        shape = [1, n] if nested else [n]
        inputs.append(_input(data, datatype, shape))
    _same(inputs)


def test_a_wrong_count_is_the_plain_error() -> None:
    outcome = _same([_input("[1.5, 2.5, 3.5]", "FP32", [2])])
    assert outcome == ("InvalidInputError", "input 'x' has 3 elements but shape [2] needs 2")


def test_malformed_json_in_data_is_the_plain_error_with_its_position() -> None:
    outcome = _same([_input("[1, 2]", "FP32", [5]), _input("[1, 02]", "FP32", [2])])
    assert outcome[0] == "InvalidInputError"
    assert outcome[1].startswith("malformed JSON in request: ")


def test_data_outside_the_inputs_stays_as_sent() -> None:
    body = _body([_input("[1, 2]", "INT8", [2])], pad=True)
    body = body[:-1] + b',"parameters":{"data":[1,2,3]}}'
    request = decode_infer_request(body)
    assert request.parameters["data"] == [1, 2, 3]
    assert request.inputs[0].data.tolist() == [1, 2]


@pytest.mark.parametrize(
    "data",
    ["[true, false]", '["a"]', "[NaN, 1]", "[[1, 2], [true, 3]]", "[1e400, -0.0]", "[[[]]]"],
)
def test_values_the_splice_leaves_to_the_parser(data: str) -> None:
    for datatype in ("FP32", "BOOL", "BYTES"):
        _same([_input(data, datatype, [2])])
