"""The HTTP infer lane on hostile bytes.

Properties:
* the head parser takes any bytes without raising, and what it accepts is an infer request
  line with a Content-Length it read as digits;
* on a running agent, a valid request cut into reads anywhere gets the same answer as sent
  whole; a damaged request is answered or the connection closes, and the agent serves on.
"""

from __future__ import annotations

import itertools
import json
import re
import socket

from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.http_lane import parse_infer_head
from agent.runtime.daemon import RunningAgent
from tests.agent.test_http_errors import GOOD
from tests.fuzz.budget import FUZZ, scaled

VALID = (
    b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: t\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)
BODY = json.dumps(GOOD).encode()
REQUEST = VALID % len(BODY) + BODY


@FUZZ
@given(head=st.binary(max_size=300) | st.builds(bytes.__add__, st.just(VALID[:-4]), st.binary()))
@example(head=VALID[:-4] % 5 + b"\r\nContent-Length: 5")
def test_any_head_parses_or_is_left_to_aiohttp(head: bytes) -> None:
    parsed = parse_infer_head(head)
    if parsed is not None:
        assert re.match(rb"POST /v2/models/[^ ]+/infer HTTP/1\.1", head)
        assert parsed.content_length >= 0


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
