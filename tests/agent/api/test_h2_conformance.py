"""HTTP/2 conformance of the loop gRPC engine, part 1: RFC 9113 §3-§6.4 (the preface, framing,
stream states and ids, DATA, HEADERS, PRIORITY, RST_STREAM), over real sockets against a running
engine (`tests/h2_probe.py`).

The cases follow h2spec's list (its section numbers are RFC 7540's; RFC 9113 keeps them, §5.3's
priority scheme aside) and assert what the RFC requires: a connection error with its GOAWAY code,
a stream error with its RST_STREAM code, or the frame handled (`tests/h2_client.py` holds the
verdicts). Part 2 (`test_h2_conformance_control.py`): SETTINGS, PING, GOAWAY, flow control,
CONTINUATION; part 3 (`test_h2_conformance_fields.py`): §8 HTTP semantics, RFC 7541, gRPC.

Not tested here, because a gRPC-only server does not do it:
* server push (§8.4): the engine never pushes, so a client's SETTINGS_ENABLE_PUSH only has its
  value checked; a client's PUSH_PROMISE is a connection error (part 2);
* the HTTP/1.1 Upgrade to h2c (RFC 7540 §3.2, removed by RFC 9113): prior knowledge or TLS ALPN
  "h2" only; TLS itself (§9.2) is Python's `ssl` with ALPN h2 (test_grpc_loop.py);
* priority signals (§5.3): RFC 9113 deprecates RFC 7540's scheme; the engine ignores it and
  enforces only the framing rules (a stream that depends on itself, PRIORITY's length);
* SETTINGS_TIMEOUT for a SETTINGS frame the client never acknowledges (§6.5.3, a MAY);
* FLOW_CONTROL_ERROR for a client that sends past our window (§6.9.1, a MAY): the engine bounds
  what a connection can make it hold instead (test_grpc_loop_connection.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import h2_client as h
from tests.h2_client import H2Client
from tests.h2_probe import ECHO, HOLD, Probe, answered, call, half_closed, opened, probe_server


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


# §3.4 The connection preface ---------------------------------------------------------------


def test_3_4_the_server_s_preface_is_a_settings_frame(raw: H2Client) -> None:
    raw.send(h.PREFACE, h.settings())
    first = raw.read()
    assert first is not None
    assert (first.kind, first.flags, first.stream) == (h.SETTINGS, 0, 0)


@pytest.mark.parametrize(
    "preface",
    [b"INVALID CONNECTION PREFACE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"],
    ids=["garbage", "http1"],
)
def test_3_4_an_invalid_preface_is_a_connection_error(raw: H2Client, preface: bytes) -> None:
    raw.send(preface)
    raw.connection_error(h.PROTOCOL_ERROR)


def test_3_4_the_client_s_first_frame_must_be_settings(raw: H2Client) -> None:
    raw.send(h.PREFACE, h.frame(h.PING, 0, 0, b"\0" * 8))
    raw.connection_error(h.PROTOCOL_ERROR)


# §4.1 Frame format -----------------------------------------------------------------------------


def test_4_1_a_frame_of_unknown_type_is_ignored(conn: H2Client) -> None:
    conn.send(h.frame(0x20, 0, 0, b"unknown"), h.frame(0xFF, 0xFF, 1, b"on an idle stream"))
    conn.ignored()


def test_4_1_undefined_flags_are_ignored(conn: H2Client) -> None:
    conn.send(h.frame(h.PING, 0x16, 0, b"flags!!!"))  # 0x16: no ACK among them
    ack, _ = conn.until(h.PING)
    assert (ack.flags, ack.payload) == (h.ACK, b"flags!!!")


def test_4_1_the_reserved_bit_of_a_stream_id_is_ignored(conn: H2Client) -> None:
    conn.send(h.frame(h.PING, 0, 0x8000_0000, b"reserved"))
    ack, _ = conn.until(h.PING)
    assert ack.payload == b"reserved"
    fields = h.request_fields(ECHO)
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 0x8000_0001, conn.block(fields)))
    conn.send(h.frame(h.DATA, h.END_STREAM, 0x8000_0001, h.grpc_message(b"hello")))
    answered(conn, 1)


# §4.2 Frame size -------------------------------------------------------------------------------


def test_4_2_a_data_frame_of_2_14_octets_is_taken(conn: H2Client) -> None:
    body = b"b" * 16_379  # 16384 with the message's prefix
    frame = h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(body))
    assert len(frame) == 9 + 16_384
    conn.send(conn.headers(1, h.request_fields(ECHO)), frame)
    answered(conn, 1, body)


def test_4_2_a_data_frame_over_the_max_frame_size_is_a_frame_size_error(conn: H2Client) -> None:
    limit = conn.server_settings[h.MAX_FRAME_SIZE]
    conn.send(opened(conn, 1, ECHO))
    header = (limit + 1).to_bytes(3, "big") + bytes([h.DATA, 0]) + (1).to_bytes(4, "big")
    conn.send(header + b"\0" * 1000)  # the header alone is over: no need to send the rest
    conn.connection_error(h.FRAME_SIZE_ERROR)


def test_4_2_a_headers_frame_over_the_max_frame_size_is_a_frame_size_error(
    conn: H2Client,
) -> None:
    limit = conn.server_settings[h.MAX_FRAME_SIZE]
    conn.send((limit + 1).to_bytes(3, "big") + bytes([h.HEADERS, h.END_HEADERS]) + b"\0\0\0\1")
    conn.connection_error(h.FRAME_SIZE_ERROR)


@pytest.mark.parametrize("max_frame", [16_384, 40_000])
def test_4_2_responses_keep_to_the_client_s_max_frame_size(raw: H2Client, max_frame: int) -> None:
    raw.handshake({h.MAX_FRAME_SIZE: max_frame, h.INITIAL_WINDOW_SIZE: 1 << 20})
    raw.send(h.window_update(0, 1 << 20))
    body = b"r" * 100_000
    raw.send(call(raw, 1, ECHO, body))
    sizes = []
    while (item := raw.read()) is not None:
        if item.kind == h.DATA:
            sizes.append(len(item.payload))
        if item.kind == h.HEADERS and item.flags & h.END_STREAM:
            break
    assert sum(sizes) == len(h.grpc_message(body))
    assert max(sizes) == max_frame  # no frame over it, and it is used


# §4.3 Field section compression ------------------------------------------------------------------


def test_4_3_an_undecodable_header_block_is_a_compression_error(conn: H2Client) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, b"\x40"))  # a cut literal
    conn.connection_error(h.COMPRESSION_ERROR)


@pytest.mark.parametrize("interloper", ["priority", "headers", "data", "ping"])
def test_4_3_a_header_block_is_one_run_of_frames(conn: H2Client, interloper: str) -> None:
    block = conn.block(h.request_fields(ECHO))
    frames = {
        "priority": h.priority(1, 0),
        "headers": conn.headers(3, h.request_fields(ECHO)),
        "data": h.frame(h.DATA, 0, 1, b"x"),
        "ping": h.frame(h.PING, 0, 0, b"\0" * 8),
    }
    conn.send(h.frame(h.HEADERS, 0, 1, block[:5]), frames[interloper])
    conn.send(h.frame(h.CONTINUATION, h.END_HEADERS, 1, block[5:]))
    conn.connection_error(h.PROTOCOL_ERROR)


# §5.1 Stream states ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        h.frame(h.DATA, 0, 1, h.grpc_message(b"x")),
        h.rst_stream(1, h.CANCEL),
        h.window_update(1, 100),
        h.frame(h.CONTINUATION, h.END_HEADERS, 1, b"\x82"),
        h.window_update(2, 100),  # an even id: never the client's
    ],
    ids=["data", "rst_stream", "window_update", "continuation", "window_update_even"],
)
def test_5_1_a_frame_on_an_idle_stream_is_a_protocol_error(conn: H2Client, frame: bytes) -> None:
    conn.send(frame)
    conn.connection_error(h.PROTOCOL_ERROR)


def test_5_1_priority_is_allowed_on_an_idle_stream(conn: H2Client) -> None:
    conn.send(h.priority(5, 0), h.priority(6, 1))
    conn.ignored()
    conn.send(call(conn, 5))  # it stayed idle: it can still open
    answered(conn, 5)


@pytest.mark.parametrize("kind", ["data", "headers"])
def test_5_1_a_half_closed_remote_stream_takes_no_more_frames(conn: H2Client, kind: str) -> None:
    conn.send(half_closed(conn, 1))
    if kind == "data":
        conn.send(h.frame(h.DATA, 0, 1, h.grpc_message(b"more")))
    else:
        conn.send(conn.headers(1, [("x-late", "1")], h.END_HEADERS | h.END_STREAM))
    conn.stream_error(1, h.STREAM_CLOSED)


def test_5_1_a_continuation_on_a_half_closed_stream_is_a_protocol_error(conn: H2Client) -> None:
    conn.send(half_closed(conn, 1), h.frame(h.CONTINUATION, h.END_HEADERS, 1, b"\x82"))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_5_1_window_update_priority_and_rst_stream_go_on_a_half_closed_stream(
    probe: Probe, conn: H2Client
) -> None:
    conn.send(conn.headers(1, h.request_fields(HOLD, **{"x-probe": "half-closed"})))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"x")))
    conn.send(h.window_update(1, 1000), h.priority(1, 0))
    conn.ignored()
    conn.send(h.rst_stream(1, h.CANCEL))
    assert probe.cancelled("half-closed").wait(10)  # the call is over
    conn.ignored()


@pytest.mark.parametrize("kind", ["data", "headers"])
@pytest.mark.parametrize("how", ["reset-by-client", "ended"])
def test_5_1_a_frame_on_a_closed_stream_is_a_stream_closed_error(
    conn: H2Client, kind: str, how: str
) -> None:
    if how == "ended":
        conn.send(call(conn, 1))
        answered(conn, 1)
    else:
        conn.send(opened(conn, 1), h.rst_stream(1, h.CANCEL))
    if kind == "data":
        conn.send(h.frame(h.DATA, 0, 1, h.grpc_message(b"late")))
    else:
        conn.send(conn.headers(1, [("x-late", "1")], h.END_HEADERS | h.END_STREAM))
    conn.stream_error(1, h.STREAM_CLOSED)


@pytest.mark.parametrize("how", ["reset-by-client", "ended"])
def test_5_1_a_continuation_on_a_closed_stream_is_a_protocol_error(
    conn: H2Client, how: str
) -> None:
    if how == "ended":
        conn.send(call(conn, 1))
        answered(conn, 1)
    else:
        conn.send(opened(conn, 1), h.rst_stream(1, h.CANCEL))
    conn.send(h.frame(h.CONTINUATION, h.END_HEADERS, 1, b"\x82"))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_5_1_window_update_and_rst_stream_on_a_closed_stream_are_ignored(
    conn: H2Client,
) -> None:
    conn.send(call(conn, 1))
    answered(conn, 1)
    conn.send(h.window_update(1, 10), h.rst_stream(1, h.CANCEL), h.priority(1, 0))
    conn.ignored()


def test_5_1_frames_on_a_stream_the_server_reset_are_ignored(conn: H2Client) -> None:
    """The server answered before the request ended (an unknown method) and reset the stream:
    what the client had already sent for it is ignored (§5.1 closed, §8.1)."""
    conn.send(opened(conn, 1, "/probe.Probe/Nope"))
    _, _, trailers = conn.response(1)
    assert trailers["grpc-status"] == "12"
    reset, _ = conn.until(h.RST_STREAM, 1)
    assert reset.code == h.NO_ERROR
    conn.send(h.frame(h.DATA, 0, 1, h.grpc_message(b"late")))
    conn.send(conn.headers(1, [("x-late", "1")], h.END_HEADERS | h.END_STREAM))
    conn.ignored()


# §5.1.1 Stream identifiers, §5.1.2 concurrency -------------------------------------------------


def test_5_1_1_an_even_stream_id_cannot_be_opened(conn: H2Client) -> None:
    conn.send(call(conn, 2))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_5_1_1_a_new_stream_id_must_be_above_every_earlier_one(conn: H2Client) -> None:
    conn.send(call(conn, 5))
    answered(conn, 5)
    conn.send(call(conn, 3))
    goaway = conn.connection_error(h.PROTOCOL_ERROR)
    assert h.last_stream(goaway) == 5  # §6.8: the last stream it processed


def test_5_1_2_streams_over_the_advertised_limit_are_refused(conn: H2Client) -> None:
    limit = conn.server_settings[h.MAX_CONCURRENT_STREAMS]
    conn.send(*(opened(conn, 1 + 2 * k) for k in range(limit)))
    over = 1 + 2 * limit
    conn.send(opened(conn, over))
    reset, _ = conn.until(h.RST_STREAM, over)
    assert reset.code in (h.REFUSED_STREAM, h.PROTOCOL_ERROR)
    conn.send(h.rst_stream(1, h.CANCEL), call(conn, over + 2))  # room again
    answered(conn, over + 2)


# §5.3.1 A stream cannot depend on itself, §5.4 error handling, §5.5 extensions ---------------


def test_5_3_1_headers_that_depend_on_their_own_stream_are_a_stream_error(conn: H2Client) -> None:
    block = conn.block(h.request_fields(ECHO))
    priority_fields = (3).to_bytes(4, "big") + b"\x10"
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.PRIORITY_FLAG, 3, priority_fields + block))
    conn.stream_error(3, h.PROTOCOL_ERROR)
    conn.send(call(conn, 5))  # the block was still decoded: the next one reads right
    answered(conn, 5)


def test_5_3_1_priority_on_itself_is_a_stream_error(conn: H2Client) -> None:
    conn.send(opened(conn, 1), h.priority(1, 1))
    conn.stream_error(1, h.PROTOCOL_ERROR)


def test_5_3_1_priority_on_itself_on_an_idle_stream_ends_the_connection(conn: H2Client) -> None:
    """An idle stream cannot be reset (§6.4), so its stream error is the connection's."""
    conn.send(h.priority(3, 3))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_5_3_headers_with_priority_fields_are_served(conn: H2Client) -> None:
    block = conn.block(h.request_fields(ECHO))
    priority_fields = (0x8000_0000).to_bytes(4, "big") + b"\xff"  # exclusive on 0, weight 256
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.PRIORITY_FLAG, 1, priority_fields + block))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"hello")))
    answered(conn, 1)


def test_5_4_1_a_connection_error_names_the_last_stream_processed(conn: H2Client) -> None:
    conn.send(call(conn, 1), call(conn, 3))
    answered(conn, 1)
    answered(conn, 3)
    conn.send(h.frame(h.PING, 0, 0, b"short"))
    goaway = conn.connection_error(h.FRAME_SIZE_ERROR)
    assert h.last_stream(goaway) == 3


def test_5_5_an_unknown_frame_on_an_open_stream_is_ignored(conn: H2Client) -> None:
    conn.send(opened(conn, 1, ECHO), h.frame(0x42, 0x1, 1, b"extension"))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"hello")))
    answered(conn, 1)


# §6.1 DATA, §6.2 HEADERS ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [h.DATA, h.HEADERS])
def test_6_1_6_2_data_and_headers_on_stream_0_are_protocol_errors(
    conn: H2Client, kind: int
) -> None:
    payload = h.grpc_message(b"x") if kind == h.DATA else conn.block(h.request_fields(ECHO))
    conn.send(h.frame(kind, h.END_HEADERS if kind == h.HEADERS else 0, 0, payload))
    conn.connection_error(h.PROTOCOL_ERROR)


@pytest.mark.parametrize("kind", [h.DATA, h.HEADERS])
def test_6_1_6_2_padding_as_long_as_the_frame_is_a_protocol_error(
    conn: H2Client, kind: int
) -> None:
    if kind == h.DATA:
        conn.send(opened(conn, 1, ECHO))
        body = h.grpc_message(b"x")
    else:
        body = conn.block(h.request_fields(ECHO))
    payload = bytes([len(body) + 1]) + body  # the padding would take the pad length too
    conn.send(h.frame(kind, h.PADDED | (h.END_HEADERS if kind == h.HEADERS else 0), 1, payload))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_6_2_headers_too_short_for_their_priority_fields_are_a_frame_size_error(
    conn: H2Client,
) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.PRIORITY_FLAG, 1, b"\0\0\0"))
    conn.connection_error(h.FRAME_SIZE_ERROR)


def test_6_1_6_2_padded_headers_and_data_are_served(conn: H2Client) -> None:
    block = conn.block(h.request_fields(ECHO))
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.PADDED, 1, b"\x03" + block + b"\0\0\0"))
    message = h.grpc_message(b"hello")
    conn.send(h.frame(h.DATA, h.PADDED, 1, b"\x00" + message[:3]))  # no padding at all
    conn.send(h.frame(h.DATA, h.PADDED | h.END_STREAM, 1, b"\x07" + message[3:] + b"\0" * 7))
    answered(conn, 1)


def test_6_2_the_client_s_trailers_end_its_request(conn: H2Client) -> None:
    conn.send(opened(conn, 1, ECHO), h.frame(h.DATA, 0, 1, h.grpc_message(b"hello")))
    conn.send(conn.headers(1, [("x-trailer", "t")], h.END_HEADERS | h.END_STREAM))
    answered(conn, 1)


# §6.3 PRIORITY, §6.4 RST_STREAM ----------------------------------------------------------------


def test_6_3_priority_on_stream_0_is_a_protocol_error(conn: H2Client) -> None:
    conn.send(h.priority(0, 1))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_6_3_priority_of_the_wrong_length_is_a_stream_error(conn: H2Client) -> None:
    conn.send(opened(conn, 1), h.frame(h.PRIORITY, 0, 1, b"\0\0\0\0"))
    conn.stream_error(1, h.FRAME_SIZE_ERROR)


def test_6_4_rst_stream_on_stream_0_is_a_protocol_error(conn: H2Client) -> None:
    conn.send(h.rst_stream(0, h.CANCEL))
    conn.connection_error(h.PROTOCOL_ERROR)


def test_6_4_rst_stream_of_the_wrong_length_is_a_frame_size_error(conn: H2Client) -> None:
    conn.send(opened(conn, 1), h.frame(h.RST_STREAM, 0, 1, b"\0\0\0"))
    conn.connection_error(h.FRAME_SIZE_ERROR)


@pytest.mark.parametrize("code", [h.CANCEL, 0xFF], ids=["cancel", "unknown-code"])
def test_6_4_7_rst_stream_cancels_the_call_whatever_its_code(
    probe: Probe, conn: H2Client, code: int
) -> None:
    tag = f"reset-{code}"
    conn.send(conn.headers(1, h.request_fields(HOLD, **{"x-probe": tag})))
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"x")))
    conn.ignored()  # the call runs
    conn.send(h.rst_stream(1, code))
    assert probe.cancelled(tag).wait(10)
    assert not [f for f in conn.ignored() if f.stream == 1]  # no answer after the reset
