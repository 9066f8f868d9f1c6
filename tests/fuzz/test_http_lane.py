"""The HTTP infer lane on hostile bytes.

Properties:
* the head parser takes any bytes without raising, and what it accepts is an infer request
  line with a Content-Length it read as digits;
* whatever it accepts, aiohttp's own parser accepts too and reads the same way (path, body
  length, header length, keep-alive): the lane never takes a request aiohttp would refuse;
* on a running agent, a valid request cut into reads anywhere gets the same answer as sent
  whole; a damaged request is answered or the connection closes, and the agent serves on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket

from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.http.lane import parse_infer_head
from agent.runtime.daemon import RunningAgent
from tests.agent.api.test_http_errors import GOOD
from tests.fuzz.budget import FUZZ, scaled

VALID = (
    b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: t\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)
BODY = json.dumps(GOOD).encode()
REQUEST = VALID % len(BODY) + BODY


_NAMES = st.sampled_from(
    [
        b"Content-Length",
        b"content-length",
        b"Inference-Header-Content-Length",
        b"Connection",
        b"Host",
        b"host",
        b"traceparent",
        b"X-Any",
        b"Transfer-Encoding",
    ]
) | st.binary(min_size=1, max_size=12)
_VALUES = st.sampled_from([b"12", b" 7 ", b"close", b"keep-alive", b"chunked", b"0"]) | st.binary(
    max_size=16
)

# Half of the drawn heads are in the lane's shape, half near misses of it.
_REQUEST_LINES = st.sampled_from(
    [
        b"POST /v2/models/mlp_classifier/infer HTTP/1.1",
        b"POST /v2/models/m/versions/3/infer HTTP/1.1",
    ]
) | st.sampled_from(
    [
        b"GET /v2/models/m/infer HTTP/1.1",
        b"POST /v2/models/m/infer HTTP/1.0",
        b"POST /v2/models/m/inferx HTTP/1.1",
        b"POST /v2/models/m/infer  HTTP/1.1",
        b"POST /v2/models/a b/infer HTTP/1.1",
        b"POST /v2/models//infer HTTP/1.1",
        b"POST /v2/models/m/versions/x/infer HTTP/1.1",
    ]
)
_LENGTHS = (
    st.sampled_from([b"0", b"5", b"007", b" 12 ", b"1" * 18])
    | st.sampled_from(
        [b"-5", b"+5", b"5x", b"", b"1" * 19, "\u0661".encode()]  # 19 digits: over the lane's 18
    )
    | st.binary(max_size=4)
)

_COMMON_FIELDS = st.sampled_from(
    [
        b"Accept: */*",
        b"User-Agent: perf_analyzer",
        b"Inference-Header-Content-Length: 12",
        b"Connection: keep-alive",
        b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ]
)


@st.composite
def _heads(draw: st.DrawFn) -> bytes:
    """Infer heads as clients send them and near misses: the request line, the Content-Length
    value, extra or repeated fields, bytes after them."""
    fields = [b"Host: t", b"Content-Type: application/json", b"Content-Length: " + draw(_LENGTHS)]
    extra = draw(st.lists(_COMMON_FIELDS | st.tuples(_NAMES, _VALUES).map(b":".join), max_size=2))
    order = draw(st.permutations(fields + extra))
    tail = draw(st.just(b"") | st.binary(max_size=4))
    return draw(_REQUEST_LINES) + b"".join(b"\r\n" + f for f in order) + tail


def _content_lengths(head: bytes) -> list[bytes]:
    """The Content-Length values of a head, read independently of the lane's parser."""
    return [
        value.strip(b" \t")
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        if name.lower() == b"content-length"
    ]


@FUZZ
@given(head=st.binary(max_size=300) | _heads())
@example(head=VALID[:-4] % 5)  # accepted: the branch below always runs at least once
@example(head=VALID[:-4] % 5 + b"\r\nContent-Length: 5")
def test_any_head_parses_or_is_left_to_aiohttp(head: bytes) -> None:
    parsed = parse_infer_head(head)
    if parsed is None:
        return
    line = re.match(
        rb"POST /v2/models/([A-Za-z0-9_.\-]+)(?:/versions/[0-9]+)?/infer HTTP/1\.1\r\n", head
    )
    assert line is not None, head
    assert parsed.model == line[1].decode()
    [length] = _content_lengths(head)  # exactly one
    assert length.isdigit(), head  # ASCII digits only: no sign, no other script's digits
    assert parsed.content_length == int(length)


def _aiohttp_reading(head: bytes) -> tuple[str, str, int, str | None, bool] | None:
    """How aiohttp's parser reads `head` (then its blank line), None: it refuses it."""
    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(BaseProtocol(loop), loop, 2**16)
        messages, _, _ = parser.feed_data(head + b"\r\n\r\n")
    except HttpProcessingError:
        return None
    finally:
        loop.close()
    if not messages:
        return None
    message = messages[0][0]
    length = message.headers.get("Content-Length")
    return (
        message.method,
        message.path,
        int(length) if length is not None else -1,
        message.headers.get("Inference-Header-Content-Length"),
        not message.should_close,
    )


@FUZZ
@given(
    version=st.sampled_from([b"", b"/versions/3"]),
    host=st.booleans(),
    fields=st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
)
def test_what_the_lane_accepts_aiohttp_reads_the_same_way(
    version: bytes, host: bool, fields: list[tuple[bytes, bytes]]
) -> None:
    head = b"POST /v2/models/m" + version + b"/infer HTTP/1.1" + (b"\r\nHost: h" if host else b"")
    head += b"".join(b"\r\n" + name + b":" + value for name, value in fields)
    parsed = parse_infer_head(head)
    if parsed is None:
        return
    reading = _aiohttp_reading(head)
    assert reading is not None, head
    method, path, length, header_length, keep_alive = reading
    assert (method, path) == ("POST", f"/v2/models/m{version.decode()}/infer")
    assert length == parsed.content_length
    expected = None if parsed.header_length is None else str(parsed.header_length)
    assert (header_length.strip() if header_length else header_length) == expected
    assert keep_alive == parsed.keep_alive


def _exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send the pieces, end our side (a request cut short ends there), read until the server
    closes: whatever it answered first."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        for piece in pieces:
            raw.sendall(piece)
        raw.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
    return received


def _answer(port: int, pieces: list[bytes]) -> bytes:
    """Send the pieces and read one answer (our side stays open: an EOF cancels the request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        for piece in pieces:
            raw.sendall(piece)
        received = b""
        while b"\r\n\r\n" not in received:
            received += raw.recv(65536)
        length = int(re.search(rb"Content-Length: ([0-9]+)", received)[1])  # type: ignore[index]
        while len(received) < received.index(b"\r\n\r\n") + 4 + length:
            received += raw.recv(65536)
    return re.sub(rb"\r\nDate: [^\r]*", b"", received)


@scaled(0.25)
@given(points=st.lists(st.integers(0, len(REQUEST)), max_size=8))
def test_a_request_cut_anywhere_gets_the_same_answer(
    agent: RunningAgent, points: list[int]
) -> None:
    cuts = sorted({0, *points, len(REQUEST)})
    pieces = [REQUEST[a:b] for a, b in itertools.pairwise(cuts)]
    whole = _answer(agent.http_port, [REQUEST])
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n")
    assert _answer(agent.http_port, pieces) == whole


@scaled(0.25)
@given(
    at=st.integers(0, len(REQUEST)),
    cut=st.integers(0, 40),
    insert=st.binary(max_size=24) | st.sampled_from([b"\r\n", b"\r\n\r\n", b" ", b"\x00", b":"]),
)
def test_a_damaged_request_is_answered_or_closed_and_the_agent_serves_on(
    agent: RunningAgent, at: int, cut: int, insert: bytes
) -> None:
    damaged = REQUEST[:at] + insert + REQUEST[at + cut :]
    answer = _exchange(agent.http_port, [damaged])
    if answer:
        assert re.match(rb"HTTP/[0-9]\.[0-9] [1-5][0-9][0-9] ", answer), answer[:80]  # 0.9: aiohttp
    assert _answer(agent.http_port, [REQUEST]).startswith(b"HTTP/1.1 200 OK\r\n")
