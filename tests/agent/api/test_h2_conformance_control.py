"""HTTP/2 conformance of the loop gRPC engine, part 2: RFC 9113 §6.5-§7 (SETTINGS, PING, GOAWAY,
WINDOW_UPDATE and flow control, CONTINUATION, error codes), over real sockets against a running
engine. Part 1 (`test_h2_conformance.py`) says how the cases are judged and what a gRPC-only
server leaves out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import h2_client as h
from tests.h2_client import H2Client
from tests.h2_probe import ECHO, HOLD, Probe, answered, call, opened, probe_server


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    with probe_server() as running:
        yield running


@pytest.fixture
def raw(probe: Probe) -> Iterator[H2Client]:
    """A connection before its preface."""
    client = H2Client(probe.port)
    yield client
    client.close()


@pytest.fixture
def conn(raw: H2Client) -> H2Client:
    """A connection past its handshake, with default settings."""
    raw.handshake()
    return raw


# §6.5 SETTINGS ---------------------------------------------------------------------------------


def test_6_5_settings_are_acknowledged(conn: H2Client) -> None:
    conn.send(h.settings({h.HEADER_TABLE_SIZE: 4096}))
    ack, _ = conn.until(h.SETTINGS)
    assert (ack.flags, ack.payload) == (h.ACK, b"")


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (h.frame(h.SETTINGS, h.ACK, 0, b"\0\x01\0\0\0\0"), h.FRAME_SIZE_ERROR),
        (h.frame(h.SETTINGS, 0, 1, b""), h.PROTOCOL_ERROR),
        (h.frame(h.SETTINGS, 0, 0, b"\0\x01\0\0\0"), h.FRAME_SIZE_ERROR),
        (h.settings({h.ENABLE_PUSH: 2}), h.PROTOCOL_ERROR),
        (h.settings({h.INITIAL_WINDOW_SIZE: 2**31}), h.FLOW_CONTROL_ERROR),
        (h.settings({h.MAX_FRAME_SIZE: 16_383}), h.PROTOCOL_ERROR),
        (h.settings({h.MAX_FRAME_SIZE: 2**24}), h.PROTOCOL_ERROR),
        (h.settings({0x9: 2}), h.PROTOCOL_ERROR),  # SETTINGS_NO_RFC7540_PRIORITIES
    ],
    ids=[
        "ack-with-payload",
        "on-a-stream",
        "length-not-6n",
        "enable-push-2",
        "initial-window-2^31",
        "max-frame-below-2^14",
        "max-frame-2^24",
        "no-rfc7540-priorities-2",
    ],
)
def test_6_5_bad_settings_are_connection_errors(conn: H2Client, frame: bytes, code: int) -> None:
    conn.send(frame)
    conn.connection_error(code)


def test_6_5_2_unknown_and_valid_settings_are_taken(conn: H2Client) -> None:
    values = {
        0x99: 7,
        h.ENABLE_PUSH: 0,
        0x9: 1,
        h.MAX_HEADER_LIST_SIZE: 100,
        h.HEADER_TABLE_SIZE: 0,
    }
    conn.send(h.settings(values), call(conn, 1))
    answered(conn, 1)


def test_6_5_3_settings_values_apply_in_order(raw: H2Client) -> None:
    raw.handshake()
    raw.send(h.settings([(h.INITIAL_WINDOW_SIZE, 100), (h.INITIAL_WINDOW_SIZE, 1)]))
    raw.send(call(raw, 1))
    data, _ = raw.until(h.DATA, 1)
    assert len(data.payload) == 1


# §6.7 PING, §6.8 GOAWAY -------------------------------------------------------------------------


def test_6_7_ping_is_answered_with_its_payload_and_an_ack_is_not(conn: H2Client) -> None:
    conn.send(h.frame(h.PING, h.ACK, 0, b"no reply"), h.frame(h.PING, 0, 0, b"h2spec!!"))
    ack, seen = conn.until(h.PING)
    assert (ack.flags, ack.payload) == (h.ACK, b"h2spec!!")
    assert not [f for f in seen if f.kind == h.PING]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (h.frame(h.PING, 0, 1, b"\0" * 8), h.PROTOCOL_ERROR),
        (h.frame(h.PING, 0, 0, b"\0" * 6), h.FRAME_SIZE_ERROR),
        (h.goaway(0, h.NO_ERROR, stream=1), h.PROTOCOL_ERROR),
        (h.frame(h.GOAWAY, 0, 0, b"\0\0\0\0\0"), h.FRAME_SIZE_ERROR),
    ],
    ids=["ping-on-a-stream", "ping-of-6-octets", "goaway-on-a-stream", "goaway-of-5-octets"],
)
def test_6_7_6_8_bad_ping_and_goaway_are_connection_errors(
    conn: H2Client, frame: bytes, code: int
) -> None:
    conn.send(frame)
    conn.connection_error(code)


def test_6_8_after_the_client_s_goaway_open_calls_finish_then_the_connection_closes(
    conn: H2Client,
) -> None:
    conn.send(opened(conn, 1, ECHO), h.goaway(0, h.NO_ERROR))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"hello")))
    answered(conn, 1)
    assert conn.read() is None


def test_7_a_goaway_with_an_unknown_code_ends_the_connection(conn: H2Client) -> None:
    """§7: an unknown code MAY be taken as INTERNAL_ERROR: the client is going away."""
    conn.send(h.goaway(0, 0xFF))
    while (item := conn.read()) is not None:
        assert item.kind != h.GOAWAY or item.code == h.NO_ERROR


# §6.9 WINDOW_UPDATE and flow control ----------------------------------------------------------


def test_6_9_a_window_update_of_0_on_the_connection_is_a_protocol_error(conn: H2Client) -> None:
    conn.send(h.window_update(0, 0))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_6_9_a_window_update_of_0_on_a_stream_is_a_stream_error(conn: H2Client) -> None:
    conn.send(opened(conn, 1), h.window_update(1, 0))
    conn.stream_error(1, h.PROTOCOL_ERROR)


def test_6_9_a_window_update_of_the_wrong_length_is_a_frame_size_error(conn: H2Client) -> None:
    conn.send(h.frame(h.WINDOW_UPDATE, 0, 0, b"\0\0\x01"))
    conn.connection_error(h.FRAME_SIZE_ERROR)


def test_6_9_1_a_window_of_1_lets_1_octet_through(raw: H2Client) -> None:
    raw.handshake({h.INITIAL_WINDOW_SIZE: 1})
    raw.send(call(raw, 1))
    data, _ = raw.until(h.DATA, 1)
    assert len(data.payload) == 1
    assert not [f for f in raw.ignored() if f.kind == h.DATA]  # nothing more without credit
    raw.send(h.window_update(1, 100))
    _, rest, trailers = raw.response(1)
    assert data.payload + rest == h.grpc_message(b"hello")
    assert trailers["grpc-status"] == "0"


def test_6_9_1_the_connection_window_holds_back_every_stream(raw: H2Client) -> None:
    raw.handshake({h.INITIAL_WINDOW_SIZE: 1 << 20})
    body = b"w" * 100_000
    raw.send(call(raw, 1, ECHO, body))
    received = 0
    while received < 65_535:  # the connection's initial window, whatever the stream's
        data, _ = raw.until(h.DATA, 1)
        received += len(data.payload)
    assert received == 65_535
    assert not [f for f in raw.ignored() if f.kind == h.DATA]
    raw.send(h.window_update(0, 1 << 20))
    _, rest, trailers = raw.response(1)
    assert received + len(rest) == len(h.grpc_message(body))
    assert trailers["grpc-status"] == "0"


def test_6_9_1_a_connection_window_over_2_31_1_is_a_flow_control_error(conn: H2Client) -> None:
    conn.send(h.window_update(0, 2**31 - 1))
    conn.connection_error(h.FLOW_CONTROL_ERROR)


def test_6_9_1_a_stream_window_over_2_31_1_is_a_stream_error(conn: H2Client) -> None:
    conn.send(opened(conn, 1), h.window_update(1, 2**31 - 1))
    conn.stream_error(1, h.FLOW_CONTROL_ERROR)


def test_6_9_2_a_new_initial_window_applies_to_open_streams(raw: H2Client) -> None:
    raw.handshake({h.INITIAL_WINDOW_SIZE: 0})
    raw.send(call(raw, 1))
    raw.until(h.HEADERS, 1)  # the response has begun
    assert not [f for f in raw.ignored() if f.kind == h.DATA]
    raw.send(h.settings({h.INITIAL_WINDOW_SIZE: 1}))
    data, _ = raw.until(h.DATA, 1)
    assert len(data.payload) == 1


def test_6_9_2_a_window_can_go_negative(raw: H2Client) -> None:
    raw.handshake({h.INITIAL_WINDOW_SIZE: 3})
    raw.send(call(raw, 1))
    data, _ = raw.until(h.DATA, 1)
    assert len(data.payload) == 3
    raw.send(h.settings({h.INITIAL_WINDOW_SIZE: 2}))  # the stream's window: 2 - 3 = -1
    assert not [f for f in raw.ignored() if f.kind == h.DATA]
    raw.send(h.window_update(1, 2))  # -1 + 2 = 1
    data, _ = raw.until(h.DATA, 1)
    assert len(data.payload) == 1


def test_6_9_the_server_gives_credit_back_for_what_it_read(conn: H2Client) -> None:
    size = 9 << 20  # over half the server's 16 MiB windows
    conn.send(opened(conn, 1, HOLD))
    message = h.grpc_message(b"c" * size)
    chunk = conn.server_settings[h.MAX_FRAME_SIZE]
    for at in range(0, len(message), chunk):
        conn.send(h.frame(h.DATA, 0, 1, message[at : at + chunk]))
    updates = {f.stream for f in conn.ignored() if f.kind == h.WINDOW_UPDATE}
    assert updates == {0, 1}


# §6.10 CONTINUATION -----------------------------------------------------------------------------


def test_6_10_a_block_in_many_continuations_is_served(conn: H2Client) -> None:
    block = conn.block(h.request_fields(ECHO, **{"x-long": "v" * 300}))
    pieces = [block[i : i + 7] for i in range(0, len(block), 7)]
    conn.send(h.frame(h.HEADERS, 0, 1, pieces[0]))
    for i, piece in enumerate(pieces[1:], start=2):
        conn.send(h.frame(h.CONTINUATION, h.END_HEADERS if i == len(pieces) else 0, 1, piece))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"hello")))
    answered(conn, 1)


@pytest.mark.parametrize(
    "case", ["on-stream-0", "after-end-headers", "after-a-finished-continuation"]
)
def test_6_10_an_unexpected_continuation_is_a_protocol_error(conn: H2Client, case: str) -> None:
    block = conn.block(h.request_fields(ECHO))
    if case == "on-stream-0":
        conn.send(h.frame(h.HEADERS, 0, 1, block), h.frame(h.CONTINUATION, h.END_HEADERS, 0, b""))
    elif case == "after-end-headers":
        conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, block))
        conn.send(h.frame(h.CONTINUATION, h.END_HEADERS, 1, b"\x82"))
    else:
        conn.send(h.frame(h.HEADERS, 0, 1, block[:4]))
        conn.send(h.frame(h.CONTINUATION, h.END_HEADERS, 1, block[4:]))
        conn.send(h.frame(h.CONTINUATION, h.END_HEADERS, 1, b"\x82"))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_6_10_an_endless_header_block_is_cut_off(conn: H2Client) -> None:
    """A CONTINUATION flood (the 2024 family of HTTP/2 attacks): over 64 KiB, the connection
    ends; the server does not buffer what the client keeps sending."""
    conn.send(h.frame(h.HEADERS, 0, 1, conn.block(h.request_fields(ECHO))))
    for _ in range(80):
        conn.send(h.frame(h.CONTINUATION, 0, 1, b"\x82" * 1024))
    conn.connection_error(h.ENHANCE_YOUR_CALM)
