"""The loop gRPC engine's message reader and header values on hostile input.

Properties:
* a message over `max_message` is refused at its prefix, whatever the reads; at most one partial
  message is buffered; a compressed one inflates to the original, or is refused with a status,
  never past the limit (zip bombs, cut or corrupt gzip/deflate, unknown encodings);
* grpc-timeout strings parse or are refused (None), through a connection too; grpc-message
  percent-encoding round-trips by the gRPC spec.
"""

from __future__ import annotations

import zlib

import hpack
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from agent.api.grpc.loop import connection as c
from agent.api.grpc.loop import frames as f
from agent.api.grpc.loop.messages import MessageReader
from agent.api.grpc.status import Status, StatusError
from tests.fuzz.budget import FUZZ
from tests.fuzz.test_grpc_loop import _cut, _headers, _message

_RESOURCE_EXHAUSTED, _UNIMPLEMENTED = 8, 12


# 1. Messages: the size limit and compression -----------------------------------------------------


@FUZZ
@given(
    limit=st.integers(0, 2000),
    sizes=st.lists(st.integers(0, 2500) | st.sampled_from([2**31, 2**32 - 1]), max_size=4),
    points=st.lists(st.integers(0, 10**5), max_size=8),
)
def test_messages_over_the_limit_are_refused_at_the_prefix(
    limit: int, sizes: list[int], points: list[int]
) -> None:
    reader = MessageReader(limit)
    # A prefix announcing more than the limit is sent without its body: it must be refused alone.
    stream = b"".join(
        _message(bytes([i % 256]) * size) if size <= limit else b"\0" + size.to_bytes(4, "big")
        for i, size in enumerate(sizes)
    )
    received, refused = _read_all(reader, _cut(stream, points))
    over = next((i for i, size in enumerate(sizes) if size > limit), len(sizes))
    expected = [bytes([i % 256]) * size for i, size in enumerate(sizes[:over])]
    if refused is None:
        assert over == len(sizes)
        assert received == expected
        return
    assert refused.status == _RESOURCE_EXHAUSTED
    assert "larger than max" in refused.message
    assert received == expected[: len(received)]  # the refused read's messages drop


def _read_all(reader: MessageReader, chunks: list[bytes]) -> tuple[list[bytes], StatusError | None]:
    """The messages read from `chunks`, and the refusal that stopped the reading, if any."""
    received: list[bytes] = []
    try:
        for chunk in chunks:
            received += reader.feed(chunk)
            # never buffered past the limit: at most one partial message waits (a white-box look)
            assert reader.buffered <= f.GRPC_PREFIX_SIZE + reader.max_message
    except StatusError as exc:
        return received, exc
    return received, None


def _compress(data: bytes, encoding: str) -> bytes:
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding, zlib.MAX_WBITS)
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(data) + packer.flush()


@FUZZ
@given(
    data=st.binary(max_size=400) | st.integers(0, 10**6).map(lambda n: b"\0" * n),
    encoding=st.sampled_from(["gzip", "deflate", "identity", "snappy", ""]),
    damage=st.sampled_from(["none", "truncate", "flip", "append", "empty"]),
    where=st.integers(0, 10**6),
    limit=st.integers(0, 1000),
)
@example(data=b"abc" * 50, encoding="gzip", damage="truncate", where=20, limit=1000)
@example(data=b"abc" * 50, encoding="deflate", damage="truncate", where=10, limit=1000)
@example(data=b"x", encoding="gzip", damage="empty", where=0, limit=1000)
def test_compressed_messages_inflate_or_are_refused_within_the_limit(
    data: bytes, encoding: str, damage: str, where: int, limit: int
) -> None:
    packed = _compress(data, encoding)
    if damage == "truncate":
        packed = packed[: where % len(packed)]
    elif damage == "flip":
        i = where % len(packed)
        packed = packed[:i] + bytes([packed[i] ^ (1 + where % 255)]) + packed[i + 1 :]
    elif damage == "append":
        packed += b"garbage"
    elif damage == "empty":
        packed = b""
    assume(len(packed) <= limit)  # the wire size fits: only inflating can break the limit
    reader = MessageReader(limit)
    reader.encoding = encoding
    received, refused = _read_all(reader, [_message(packed, compressed=True)])
    if refused is not None:
        assert refused.message.strip()
        if encoding not in ("gzip", "deflate"):
            assert refused.status == _UNIMPLEMENTED
        elif damage == "none" and len(data) > limit:
            assert refused.status == _RESOURCE_EXHAUSTED
        return
    [message] = received
    assert len(message) <= limit
    assert message == data  # never a part of it, never something else


# 2. Header values --------------------------------------------------------------------------------


_UNIT_SECONDS = {"H": 3600, "M": 60, "S": 1, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Valid timeouts as well as the near misses: random text is almost never one.
_TIMEOUTS = st.from_regex(r"\A[0-9]{1,9}[HMSmunsh]?\Z") | st.text(
    st.sampled_from("0123456789HMSmun") | st.characters(max_codepoint=0xFF), max_size=12
)


def _spec_seconds(value: str) -> float | None:
    """The gRPC spec's TimeoutValue (1-8 ASCII digits) and TimeoutUnit, in seconds; None when
    `value` is not one. Written from the spec, not from the code under test."""
    digits, unit = value[:-1], value[-1:]
    if not (1 <= len(digits) <= 8 and digits.isascii() and digits.isdigit()):
        return None
    factor = _UNIT_SECONDS.get(unit)
    return None if factor is None else int(digits) * factor


@FUZZ
@given(_TIMEOUTS)
@example("²S")  # found reading the code: str.isdigit takes "²", int() does not (ValueError)
@example("\u0661\u0662S")  # Arabic-Indic digits: not gRPC's, were taken as 12 s
@example("99999999H")
@example("100m")
def test_grpc_timeouts_parse_or_are_refused(value: str) -> None:
    expected = _spec_seconds(value)
    parsed = f.parse_timeout(value)
    assert parsed == (None if expected is None else pytest.approx(expected)), value


@FUZZ
@given(_TIMEOUTS.map(lambda text: text.encode("latin-1", "replace")) | st.binary(max_size=12))
@example(b"\xb2S")
@example(b"250m")  # a valid one: the connection must hand it on, not drop it
@example(b"1S\r\n")
@example(b" 1S")
def test_a_connection_takes_any_grpc_timeout_header(value: bytes) -> None:
    conn = c.Connection(max_message=1000)
    conn.receive(f.PREFACE + f.settings_frame({}))
    conn.data_to_send()
    block = _headers(hpack.Encoder(), **{"grpc-timeout": value})
    events = conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, block))
    # RFC 9113 §8.2.1: no NUL, CR or LF in a value, no space or tab at its ends; else malformed
    field_ok = not any(b in value for b in b"\0\r\n") and not (
        value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t")
    )
    if not field_ok:  # a stream error; the connection goes on
        assert events == []
        assert conn.data_to_send() == f.rst_stream_frame(1, f.PROTOCOL_ERROR)
        return
    [started] = events
    assert isinstance(started, c.RequestStarted)
    expected = _spec_seconds(value.decode("latin-1"))
    assert started.timeout_s == (None if expected is None else pytest.approx(expected)), value


def _percent_decode(raw: bytes) -> str:
    """The gRPC spec's grpc-message decoding: %XX to its byte, then UTF-8."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x25 and _is_hex(raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(chr(b) in "0123456789abcdefABCDEF" for b in pair)


@FUZZ
@given(st.text(max_size=60))
@example("100% done\r\n\x00é€😀")
@example("%41")
def test_grpc_message_percent_encoding_round_trips(message: str) -> None:
    encoded = f.percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)  # a valid HTTP/2 header value
    assert _percent_decode(encoded) == message
    block = f.trailers_block(Status.INTERNAL, message)
    headers = dict(hpack.Decoder().decode(block, raw=True))
    assert _percent_decode(headers.get(b"grpc-message", b"")) == message
