"""The loop gRPC engine's pure core: frames and one connection's state, bytes in and out."""

from __future__ import annotations

import sys
import zlib

import hpack
import pytest

from agent.api.grpc.loop import connection as c
from agent.api.grpc.loop import frames as f
from agent.api.grpc.status import Status

PATH = "/inference.GRPCInferenceService/ModelInfer"


def request_headers(encoder: hpack.Encoder, path: str = PATH, **extra: str) -> bytes:
    return encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra.items(),
        ]
    )


def handshake(conn: c.Connection, settings: dict[int, int] | None = None) -> None:
    conn.receive(f.PREFACE + f.settings_frame(settings or {}))


def parse_all(data: bytes) -> list[tuple[int, int, int, bytes]]:
    buffer, out = bytearray(data), []
    while (parsed := f.take_frame(buffer, 1 << 24)) is not None:
        out.append(parsed)
    assert not buffer
    return out


def decoded_headers(block: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in hpack.Decoder().decode(block)}


def message(payload: bytes) -> bytes:
    return f.grpc_prefix(len(payload)) + payload


def test_frames_round_trip_and_wait_for_a_whole_frame() -> None:
    data = f.frame(f.PING, 0, 0, b"12345678") + f.window_update_frame(3, 99)
    buffer = bytearray(data[:12])
    assert f.take_frame(buffer, 16384) is None
    buffer += data[12:]
    assert f.take_frame(buffer, 16384) == (f.PING, 0, 0, b"12345678")
    kind, _, stream, payload = f.take_frame(buffer, 16384) or (0, 0, 0, b"")
    assert (kind, stream, f.parse_u32(payload)) == (f.WINDOW_UPDATE, 3, 99)
    with pytest.raises(f.FrameError):
        f.take_frame(bytearray(f.frame(f.DATA, 0, 1, b"x" * 100)), 50)


def test_padding_and_priority_are_stripped() -> None:
    payload = bytes([2]) + b"\x00\x00\x00\x01\x10" + b"block" + b"\x00\x00"
    assert f.strip_padding(f.PADDED | f.PRIORITY_FLAG, payload, priority=True) == b"block"
    with pytest.raises(f.FrameError):
        f.strip_padding(f.PADDED, bytes([9]) + b"ab")


def test_hand_written_header_blocks_decode_with_hpack() -> None:
    block = f.RESPONSE_HEADERS + f.trailers_block(Status.NOT_FOUND, "model 'x' not found: 100% é")
    headers = decoded_headers(block)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert headers["grpc-status"] == "5"
    assert headers["grpc-message"] == "model 'x' not found: 100%25 %C3%A9"
    long = f.trailers_block(Status.INTERNAL, "m" * 5000)  # multi-byte HPACK lengths
    assert decoded_headers(long)["grpc-message"] == "m" * 5000


def test_timeouts_parse() -> None:
    assert f.parse_timeout("100m") == pytest.approx(0.1)
    assert f.parse_timeout("2S") == 2.0
    assert f.parse_timeout("1x") is None
    assert f.parse_timeout("m") is None


def test_a_unary_call_in_and_its_answer_out() -> None:
    conn = c.Connection(max_message=1000)
    opening = parse_all(conn.data_to_send())
    assert [kind for kind, *_ in opening] == [f.SETTINGS, f.WINDOW_UPDATE]
    handshake(conn)
    assert parse_all(conn.data_to_send()) == [(f.SETTINGS, f.ACK, 0, b"")]
    encoder = hpack.Encoder()
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder, **{"x-key": "v"}))
        + f.frame(f.DATA, f.END_STREAM, 1, message(b"hello"))
    )
    assert events == [
        c.RequestStarted(1, PATH, (("x-key", "v"),), None),
        c.MessageReceived(1, b"hello"),
        c.InputEnded(1),
    ]
    conn.send_message(1, b"world")
    conn.finish(1, Status.OK)
    out = parse_all(conn.data_to_send())
    assert [(kind, flags) for kind, flags, *_ in out] == [
        (f.HEADERS, f.END_HEADERS),
        (f.DATA, 0),
        (f.HEADERS, f.END_HEADERS | f.END_STREAM),
    ]
    assert out[1][3] == message(b"world")
    assert decoded_headers(out[2][3]) == {"grpc-status": "0"}
    assert not conn.streams


def test_a_message_split_across_frames_is_reassembled() -> None:
    conn = c.Connection(max_message=1000)
    handshake(conn)
    data = message(b"x" * 300)
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder()))
        + f.frame(f.DATA, 0, 1, data[:3])
        + f.frame(f.DATA, 0, 1, data[3:200])
        + f.frame(f.DATA, f.END_STREAM, 1, data[200:] + message(b"y"))
    )
    assert [e for e in events if isinstance(e, c.MessageReceived)] == [
        c.MessageReceived(1, b"x" * 300),
        c.MessageReceived(1, b"y"),
    ]


def test_a_message_over_the_limit_is_refused_at_its_prefix() -> None:
    conn = c.Connection(max_message=100)
    handshake(conn)
    conn.data_to_send()
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder()))
        + f.frame(f.DATA, 0, 1, f.grpc_prefix(5000) + b"z" * 10)
    )
    assert events[-1] == c.StreamReset(1)
    out = parse_all(conn.data_to_send())
    headers = decoded_headers(out[0][3])
    assert headers["grpc-status"] == "8"
    assert headers["grpc-message"] == "Received message larger than max (5000 vs. 100)"
    assert out[1][0] == f.RST_STREAM  # the client stops sending the rest
    # The rest of the body is ignored; the connection goes on.
    assert conn.receive(f.frame(f.DATA, f.END_STREAM, 1, b"z" * 50)) == []
    assert not conn.ended


def test_a_compressed_message_is_unimplemented() -> None:
    conn = c.Connection(max_message=100)
    handshake(conn)
    conn.data_to_send()
    conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder()))
        + f.frame(f.DATA, f.END_STREAM, 1, b"\x01\x00\x00\x00\x01z")
    )
    assert decoded_headers(parse_all(conn.data_to_send())[0][3])["grpc-status"] == "12"


def test_a_response_over_the_peer_window_waits_for_window_updates() -> None:
    conn = c.Connection(max_message=1 << 20)
    handshake(conn, {f.INITIAL_WINDOW_SIZE: 1000})
    conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, request_headers(hpack.Encoder()))
    )
    conn.data_to_send()
    conn.send_message(1, b"r" * 3000)
    conn.finish(1, Status.OK)
    sent = parse_all(conn.data_to_send())
    assert sum(len(p) for kind, _, _, p in sent if kind == f.DATA) == 1000
    assert all(not flags & f.END_STREAM for _, flags, _, _ in sent)  # trailers wait
    assert conn.backlog(1) == 3005 - 1000
    events = conn.receive(f.window_update_frame(1, 10_000))
    assert events == [c.WindowOpened()]
    rest = parse_all(conn.data_to_send())
    assert sum(len(p) for kind, _, _, p in rest if kind == f.DATA) == 2005
    assert rest[-1][0] == f.HEADERS
    assert rest[-1][1] & f.END_STREAM
    assert not conn.streams


def test_credit_is_returned_once_half_the_window_is_consumed() -> None:
    conn = c.Connection(max_message=c.OUR_WINDOW)
    handshake(conn)
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder())))
    conn.data_to_send()
    chunk = b"d" * c.OUR_MAX_FRAME
    first = f.grpc_prefix(c.OUR_WINDOW - 5) + chunk[5:]  # one message larger than half
    conn.receive(f.frame(f.DATA, 0, 1, first))
    for _ in range(c.OUR_WINDOW // 2 // len(chunk) - 1):
        conn.receive(f.frame(f.DATA, 0, 1, chunk))
    updates = [(s, f.parse_u32(p)) for k, _, s, p in parse_all(conn.data_to_send()) if k == 8]
    assert updates == [(0, c.OUR_WINDOW // 2), (1, c.OUR_WINDOW // 2)]


def test_ping_is_acknowledged_and_a_headers_block_may_continue() -> None:
    conn = c.Connection(max_message=100)
    handshake(conn)
    conn.data_to_send()
    conn.receive(f.frame(f.PING, 0, 0, b"abcdefgh"))
    assert parse_all(conn.data_to_send()) == [(f.PING, f.ACK, 0, b"abcdefgh")]
    block = request_headers(hpack.Encoder())
    events = conn.receive(
        f.frame(f.HEADERS, 0, 1, block[:10]) + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[10:])
    )
    assert events == [c.RequestStarted(1, PATH, (), None)]


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        f.PREFACE + f.frame(f.PING, 0, 0, b"12345678"),  # SETTINGS must come first
        f.PREFACE + f.settings_frame({}) + f.frame(f.HEADERS, f.END_HEADERS, 2, b""),
        f.PREFACE + f.settings_frame({}) + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff"),
    ],
    ids=["http1", "no-settings", "even-stream", "bad-hpack"],
)
def test_a_broken_client_gets_goaway(data: bytes) -> None:
    conn = c.Connection(max_message=100)
    conn.data_to_send()
    events = conn.receive(data)
    assert isinstance(events[-1], c.ConnectionEnded)
    assert parse_all(conn.data_to_send())[-1][0] == f.GOAWAY
    assert conn.receive(b"more") == []


def test_streams_over_the_cap_are_refused_and_goaway_stops_new_ones() -> None:
    conn = c.Connection(max_message=100, max_streams=1)
    handshake(conn)
    encoder = hpack.Encoder()
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder)))
    conn.data_to_send()
    assert conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 3, request_headers(encoder))) == []
    (rst,) = parse_all(conn.data_to_send())
    assert (rst[0], rst[2], f.parse_u32(rst[3])) == (f.RST_STREAM, 3, f.REFUSED_STREAM)
    conn.goaway()
    assert parse_all(conn.data_to_send())[0][0] == f.GOAWAY
    assert conn.closing
    assert 1 in conn.streams  # open calls finish


def test_a_client_reset_ends_the_call() -> None:
    conn = c.Connection(max_message=100)
    handshake(conn)
    conn.receive(f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder())))
    assert conn.receive(f.rst_stream_frame(1, f.CANCEL)) == [c.StreamReset(1)]
    conn.data_to_send()
    conn.finish(1, Status.OK)  # the handler's late answer goes nowhere
    assert conn.data_to_send() == b""


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_message_is_inflated_within_the_limit(encoding: str) -> None:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    packer = zlib.compressobj(wbits=wbits)
    small = packer.compress(b"a" * 100) + packer.flush()
    conn = c.Connection(max_message=1000)
    handshake(conn)
    encoder = hpack.Encoder()
    headers = request_headers(encoder, **{"grpc-encoding": encoding})
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 1, headers)
        + f.frame(f.DATA, f.END_STREAM, 1, b"\x01" + message(small)[1:])
    )
    assert c.MessageReceived(1, b"a" * 100) in events
    packer = zlib.compressobj(wbits=wbits)
    bomb = packer.compress(b"a" * 5000) + packer.flush()  # small on the wire, over once inflated
    conn.data_to_send()
    headers = request_headers(encoder, **{"grpc-encoding": encoding})
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS, 3, headers)
        + f.frame(f.DATA, f.END_STREAM, 3, b"\x01" + message(bomb)[1:])
    )
    assert events[-1] == c.StreamReset(3)
    assert decoded_headers(parse_all(conn.data_to_send())[0][3])["grpc-status"] == "8"


def test_frames_split_anywhere_across_reads_give_the_same_events() -> None:
    encoder = hpack.Encoder()
    wire = (
        f.PREFACE
        + f.settings_frame({})
        + f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder))
        + f.frame(f.DATA, 0, 1, message(b"p" * 700)[:300])
        + f.frame(f.DATA, f.END_STREAM, 1, message(b"p" * 700)[300:])
    )
    whole = c.Connection(max_message=1000).receive(wire)
    for size in (1, 7, 64, 500):
        conn = c.Connection(max_message=1000)
        events = []
        for start in range(0, len(wire), size):
            events += conn.receive(wire[start : start + size])
        assert events == whole, size
    assert c.MessageReceived(1, b"p" * 700) in whole


@pytest.mark.parametrize("content_type", ["text/html", "application/json", None])
def test_a_request_that_is_not_grpc_is_answered_415(content_type: str | None) -> None:
    conn = c.Connection(max_message=1 << 20)
    handshake(conn)
    conn.data_to_send()
    fields = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x")]
    if content_type is not None:
        fields.append(("content-type", content_type))
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, hpack.Encoder().encode(fields))
    )
    assert events == []
    [(kind, flags, stream, block)] = parse_all(conn.data_to_send())
    assert (kind, flags, stream) == (f.HEADERS, f.END_HEADERS | f.END_STREAM, 1)
    assert decoded_headers(block) == {":status": "415"}
    # the connection goes on: a gRPC call on the next stream is served
    events = conn.receive(
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, request_headers(hpack.Encoder()))
    )
    assert events[0] == c.RequestStarted(3, PATH, (), None)


def test_unfinished_messages_a_connection_holds_are_capped() -> None:
    conn = c.Connection(max_message=1000)
    conn.held_limit = 2500  # the default is max_message + the window: too large to fill here
    handshake(conn)
    conn.data_to_send()
    encoder = hpack.Encoder()
    part = f.grpc_prefix(900) + b"p" * 595  # 595 of a message's 900 bytes (its prefix is read)
    for sid in (1, 3, 5, 7, 9):
        events = conn.receive(
            f.frame(f.HEADERS, f.END_HEADERS, sid, request_headers(encoder))
            + f.frame(f.DATA, 0, sid, part)
        )
    assert conn.held == 4 * 595  # four calls; the fifth went over
    assert events[-1] == c.StreamReset(9)
    trailers = [
        decoded_headers(block)
        for kind, _, stream, block in parse_all(conn.data_to_send())
        if kind == f.HEADERS and stream == 9
    ]
    assert trailers[-1]["grpc-status"] == "8"
    assert "unfinished messages" in trailers[-1]["grpc-message"]
    conn.receive(f.rst_stream_frame(1, f.CANCEL))  # the client gives one up
    assert conn.held == 3 * 595
    events = conn.receive(f.frame(f.DATA, f.END_STREAM, 3, b"q" * 305))  # one completes
    assert c.MessageReceived(3, b"p" * 595 + b"q" * 305) in events
    assert conn.held == 2 * 595


def _data_frames(sid: int, payload: bytes, size: int = 16_384, end: bool = True) -> bytes:
    """`payload` as DATA frames of `size` bytes (as grpc clients cut a large message)."""
    cuts = range(0, len(payload), size)
    return b"".join(
        f.frame(
            f.DATA,
            f.END_STREAM if end and i + size >= len(payload) else 0,
            sid,
            payload[i : i + size],
        )
        for i in cuts
    )


def test_a_large_message_in_many_frames_and_reads_arrives_whole() -> None:
    conn = c.Connection(max_message=1 << 21)
    handshake(conn)
    body = bytes(range(256)) * 2352  # 602,112 bytes: a 224x224x3 FP32 image and its framing
    wire = f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder()))
    wire += _data_frames(1, message(body))
    events: list[c.Event] = []
    for start in range(0, len(wire), 262_144):  # the event loop's reads
        events += conn.receive(wire[start : start + 262_144])
    assert [e for e in events if isinstance(e, c.MessageReceived)] == [c.MessageReceived(1, body)]
    assert c.InputEnded(1) in events
    assert conn.held == 0


def test_a_few_bytes_held_for_a_call_do_not_keep_the_whole_read() -> None:
    """Views of a read are kept only for a call that holds at least half of it; less is
    copied out, so a client cannot pin a large read with one byte of an unfinished message."""
    conn = c.Connection(max_message=1 << 21)
    handshake(conn)
    encoder = hpack.Encoder()
    read = (
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder))
        + _data_frames(1, message(b"a" * 100_000))
        + f.frame(f.HEADERS, f.END_HEADERS, 3, request_headers(encoder))
        + f.frame(f.DATA, 0, 3, message(b"b" * 50)[:20])  # the prefix and 15 bytes of 50
    )
    unheld = sys.getrefcount(read)
    conn.receive(read)
    assert conn.held == 15
    assert sys.getrefcount(read) == unheld  # nothing points into the read any more
    rest = f.frame(f.DATA, 0, 3, b"b" * 30)  # most of this read waits: kept as a view
    conn.receive(rest)
    assert conn.held == 45
    events = conn.receive(f.frame(f.DATA, f.END_STREAM, 3, b"b" * 5))
    assert c.MessageReceived(3, b"b" * 50) in events
    assert conn.held == 0


def test_a_frame_completed_from_the_last_read_does_not_count_as_this_read_s() -> None:
    """Found in review: the copy of a frame that straddled two reads counted toward "half of
    this read", so one byte of a view kept a whole read alive beside it."""
    conn = c.Connection(max_message=1 << 21)
    handshake(conn)
    encoder = hpack.Encoder()
    first = message(b"a" * 200_000)[:100_000]  # a frame of 100 KB, cut after 40 KB
    wire = f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder))
    wire += f.frame(f.DATA, 0, 1, first)
    cut = len(wire) - 60_000
    conn.receive(wire[:cut])
    read = (
        wire[cut:]  # the rest of that frame: completed into a copy of its own
        + f.frame(f.DATA, 0, 1, b"a")  # one byte of this read for the same call
        + f.frame(f.HEADERS, f.END_HEADERS, 3, request_headers(encoder))
        + _data_frames(3, message(b"c" * 100_000))  # another call, whole
    )
    unheld = sys.getrefcount(read)
    events = conn.receive(read)
    assert c.MessageReceived(3, b"c" * 100_000) in events
    assert conn.held == 100_001 - 5
    assert sys.getrefcount(read) == unheld


def test_a_broken_frame_in_a_read_ends_the_connection_before_the_read_s_frames_act() -> None:
    """A read that completes a cut frame and then holds a frame over the size limit: GOAWAY,
    and the completed frame is not acted on (as when the whole frame came in that read)."""
    conn = c.Connection(max_message=1000)
    handshake(conn)
    call = f.frame(f.HEADERS, f.END_HEADERS, 1, request_headers(hpack.Encoder()))
    data = f.frame(f.DATA, f.END_STREAM, 1, message(b"x" * 10))
    conn.receive(call + data[:5])
    too_long = (
        (c.OUR_MAX_FRAME + 1).to_bytes(3, "big") + bytes([f.DATA, 0]) + (1).to_bytes(4, "big")
    )
    events = conn.receive(data[5:] + too_long)
    assert [type(e) for e in events] == [c.ConnectionEnded]
