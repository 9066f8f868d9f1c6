"""The loop gRPC engine's pure core (frames, one connection) on hostile bytes.

Properties:
* any bytes, with or without the preface, make events or a GOAWAY (`ConnectionEnded`), never
  another exception; what the connection writes always parses as frames of the peer's size;
* a valid sequence of frames gives the same events and bytes out however it is cut into reads,
  and each call's messages arrive as they were sent;
* the DATA we send never exceeds the peer's windows, and everything queued goes out once the
  peer gives enough credit;
And on a running agent: random bytes on the gRPC port close the connection, and a real
tritonclient call is served after them. Messages and header values: test_grpc_loop_values.py.
"""

from __future__ import annotations

import itertools
import socket
from dataclasses import dataclass, field

import hpack
import numpy as np
import tritonclient.grpc as grpcclient
from hypothesis import example, given
from hypothesis import strategies as st

from agent.api.grpc.loop import connection as c
from agent.api.grpc.loop import frames as f
from agent.api.grpc.status import Status
from agent.config.schema import ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.fuzz.budget import FUZZ, scaled

PATH = "/inference.GRPCInferenceService/ModelInfer"


def _parse_out(data: bytes, max_frame: int = f.DEFAULT_MAX_FRAME) -> list[f.Frame]:
    """Our bytes as frames: whole, within the peer's frame size, on valid stream ids."""
    frames, used = f.split_frames(data, max_frame)
    assert used == len(data), "a partial frame was written"
    sent_kinds = (f.DATA, f.HEADERS, f.CONTINUATION, f.SETTINGS, f.PING, f.GOAWAY)
    for kind, _, sid, payload in frames:
        assert kind in (*sent_kinds, f.WINDOW_UPDATE, f.RST_STREAM), kind
        if kind in (f.SETTINGS, f.PING, f.GOAWAY):
            assert sid == 0
        if kind in (f.DATA, f.HEADERS, f.CONTINUATION, f.RST_STREAM):
            assert sid % 2 == 1
        if kind == f.WINDOW_UPDATE:
            assert 1 <= f.parse_u32(payload) <= f.MAX_WINDOW
        if kind == f.GOAWAY:
            assert len(payload) >= 8
    return frames


def _headers(encoder: hpack.Encoder, **extra: str | bytes) -> bytes:
    fields: list[tuple[str, str | bytes]] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra.items(),
    ]
    return bytes(encoder.encode(fields))


def _message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes([int(compressed)]) + len(payload).to_bytes(4, "big") + payload


def _receive_checked(conn: c.Connection, chunks: list[bytes]) -> tuple[list[c.Event], bytes]:
    events: list[c.Event] = []
    for chunk in chunks:
        events += conn.receive(chunk)
    return events, conn.data_to_send()


def _check_order(events: list[c.Event]) -> None:
    """Per stream: started, messages, at most one end of input; nothing after a reset."""
    state: dict[int, str] = {}
    for event in events:
        if isinstance(event, c.RequestStarted):
            assert event.stream not in state, event
            state[event.stream] = "open"
        elif isinstance(event, c.MessageReceived):
            assert state.get(event.stream) == "open", event
        elif isinstance(event, c.InputEnded):
            assert state.get(event.stream) == "open", event  # twice would run the call twice
            state[event.stream] = "ended"
        elif isinstance(event, c.StreamReset):
            assert state.get(event.stream) in ("open", "ended"), event
            state[event.stream] = "reset"


def _cut(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(cuts)]


# 1. Garbage --------------------------------------------------------------------------------------

_ANY_FRAME = st.builds(
    f.frame,
    st.integers(0, 12),
    st.integers(0, 255),
    st.integers(0, 2**31 - 1) | st.integers(0, 5),
    st.binary(max_size=40),
)


# Header blocks as HPACK decodes them: valid ones with bytes changed, and bytes of its opcodes.
_BLOCK = st.one_of(
    st.builds(
        lambda block, at, byte: block[:at] + bytes([byte]) + block[at + 1 :],
        st.binary(max_size=6).map(lambda t: _headers(hpack.Encoder(), **{"grpc-timeout": t})),
        st.integers(0, 120),
        st.integers(0, 255),
    ),
    st.lists(
        st.sampled_from([b"\x82", b"\x86", b"\xbe", b"\xff\x80", b"\x3f\xe1\x1f", b"\x20", b"\x40",
                         b"\x00", b"\x10", b"\x7f", b"\x8f", b"\x01a", b"\x81\xff"])
        | st.binary(max_size=3),
        max_size=10,
    ).map(b"".join),
)  # fmt: skip
_HEADER_FRAME = st.builds(
    f.frame,
    st.sampled_from([f.HEADERS, f.CONTINUATION]),
    st.sampled_from([f.END_HEADERS, f.END_HEADERS | f.END_STREAM, 0, f.PADDED, f.PRIORITY_FLAG]),
    st.sampled_from([1, 3, 2]),
    _BLOCK,
)


@FUZZ
@given(
    prefix=st.sampled_from([b"", f.PREFACE, f.PREFACE + f.settings_frame({})]),
    body=st.lists(st.binary(max_size=64) | _ANY_FRAME | _HEADER_FRAME, max_size=8).map(b"".join),
    points=st.lists(st.integers(0, 1000), max_size=5),
)
@example(prefix=f.PREFACE, body=b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", points=[])  # ACK first
def test_any_bytes_make_events_or_a_goaway(prefix: bytes, body: bytes, points: list[int]) -> None:
    conn = c.Connection(max_message=1000)
    _parse_out(conn.data_to_send())
    events, out = _receive_checked(conn, _cut(prefix + body, points))
    _check_order(events)
    frames = _parse_out(out)
    ended = [e for e in events if isinstance(e, c.ConnectionEnded)]
    assert len(ended) <= 1
    if ended:
        assert ended[0].message.strip()
        assert events[-1] == ended[0]  # nothing after the end
        assert conn.receive(b"more") == []
        if ended[0].message != "the client sent GOAWAY":
            assert frames[-1][0] == f.GOAWAY


# 2. Valid frame sequences, cut anywhere ----------------------------------------------------------

_NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12).map(
    lambda name: "x-" + name
)
# (RFC 9113 §8.2.1: no space at a value's ends; a value with one is malformed)
_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(
    lambda value: value.strip(" ")
)
_SETTING_VALUES = st.fixed_dictionaries(
    {},
    optional={
        f.HEADER_TABLE_SIZE: st.integers(0, 2**32 - 1),
        f.ENABLE_PUSH: st.integers(0, 1),  # anything else is a PROTOCOL_ERROR
        f.MAX_CONCURRENT_STREAMS: st.integers(0, 2**32 - 1),
        0x99: st.integers(0, 2**32 - 1),
    },
) | st.fixed_dictionaries(
    {f.INITIAL_WINDOW_SIZE: st.integers(0, f.MAX_WINDOW - 100_000)},  # room for updates
    optional={f.MAX_FRAME_SIZE: st.integers(f.DEFAULT_MAX_FRAME, 2**24 - 1)},
)


@dataclass
class _Conversation:
    """A client's frames and what the server must make of them."""

    wire: bytes
    sent: dict[int, list[bytes]] = field(default_factory=dict)  # stream: its messages
    metadata: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    reset: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)  # opened after the client's GOAWAY
    broken: bool = False  # a frame the server must answer with GOAWAY


def _padded(draw: st.DrawFn, kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    if not draw(st.booleans()):
        return f.frame(kind, flags, sid, payload)
    pad = draw(st.integers(0, 20))
    return f.frame(kind, flags | f.PADDED, sid, bytes([pad]) + payload + b"\0" * pad)


@st.composite
def _conversation(draw: st.DrawFn) -> _Conversation:
    encoder = hpack.Encoder()
    talk = _Conversation(wire=f.PREFACE + f.settings_frame(draw(_SETTING_VALUES)))
    parts = [talk.wire]
    next_sid, gone = 1, False
    open_streams: list[int] = []
    half_closed: list[int] = []
    for _ in range(draw(st.integers(0, 12))):
        op = draw(st.sampled_from(["open", "data", "end", "ping", "settings", "window", "reset",
                                   "priority", "unknown", "goaway", "bad-window", "trailers",
                                   "again"]))  # fmt: skip
        if op == "open" or (op in ("data", "end", "reset") and not open_streams):
            sid, next_sid = next_sid, next_sid + 2 * draw(st.integers(1, 3))
            metadata = tuple(draw(st.lists(st.tuples(_NAME, _VALUE), max_size=4)))
            block = _headers(encoder, **dict(metadata))
            talk.metadata[sid] = tuple(dict(metadata).items())
            talk.sent[sid] = []
            if gone:
                talk.refused.add(sid)
            flags = f.END_STREAM if draw(st.booleans()) else 0
            pieces = _cut(block, draw(st.lists(st.integers(0, len(block)), max_size=3)))
            first = pieces[0]
            if draw(st.booleans()):  # priority fields before the block
                flags |= f.PRIORITY_FLAG
                first = b"\x00\x00\x00\x00\x10" + first
            end = f.END_HEADERS if len(pieces) == 1 else 0
            parts.append(_padded(draw, f.HEADERS, flags | end, sid, first))
            for i, piece in enumerate(pieces[1:], start=2):
                end = f.END_HEADERS if i == len(pieces) else 0
                parts.append(f.frame(f.CONTINUATION, end, sid, piece))
            if not flags & f.END_STREAM:
                open_streams.append(sid)
            elif not gone:
                half_closed.append(sid)
        elif op in ("data", "end"):
            sid = draw(st.sampled_from(open_streams))
            messages = draw(st.lists(st.binary(max_size=300), max_size=3))
            talk.sent[sid] += messages
            stream = b"".join(_message(m) for m in messages)
            pieces = _cut(stream, draw(st.lists(st.integers(0, len(stream)), max_size=4)))
            for i, piece in enumerate(pieces, start=1):
                last = op == "end" and i == len(pieces)
                parts.append(_padded(draw, f.DATA, f.END_STREAM if last else 0, sid, piece))
            if op == "end":
                open_streams.remove(sid)
                half_closed.append(sid)
        elif op == "trailers" and open_streams:  # the client's trailers end its input
            sid = draw(st.sampled_from(open_streams))
            block = bytes(encoder.encode([("x-trailer", draw(_VALUE))]))
            parts.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, block))
            open_streams.remove(sid)
            half_closed.append(sid)
        elif op == "again" and half_closed:  # a second end of input: that stream is reset
            sid = draw(st.sampled_from(half_closed))
            block = bytes(encoder.encode([("x-trailer", "again")]))
            parts.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, block))
            half_closed.remove(sid)
            talk.reset.add(sid)
        elif op == "ping":
            parts.append(f.frame(f.PING, draw(st.sampled_from([0, f.ACK])), 0, b"p" * 8))
        elif op == "settings":
            parts.append(f.settings_frame(draw(_SETTING_VALUES)))
        elif op == "window":
            sid = draw(st.sampled_from([0, *open_streams]))
            parts.append(f.window_update_frame(sid, draw(st.integers(1, 1000))))
        elif op == "reset" and open_streams:
            sid = draw(st.sampled_from(open_streams))
            parts.append(f.rst_stream_frame(sid, draw(st.sampled_from([0, f.CANCEL]))))
            open_streams.remove(sid)
            talk.reset.add(sid)
        elif op == "priority":
            parts.append(f.frame(f.PRIORITY, 0, next_sid, b"\x00\x00\x00\x00\x10"))
        elif op == "unknown":
            parts.append(f.frame(draw(st.integers(10, 255)), 0xFF, 0, draw(st.binary(max_size=9))))
        elif op == "goaway":
            parts.append(f.goaway_frame(0, f.NO_ERROR))
            gone = True
        elif op == "bad-window":  # a WINDOW_UPDATE of 0, or one past 2^31-1: GOAWAY
            talk.broken = True
            parts.append(f.window_update_frame(0, draw(st.sampled_from([0, f.MAX_WINDOW]))))
            parts.append(f.window_update_frame(0, f.MAX_WINDOW))
    talk.wire = b"".join(parts)
    return talk


@FUZZ
@given(talk=_conversation(), points=st.lists(st.integers(0, 10**6), max_size=12))
def test_frames_cut_anywhere_give_the_same_events(talk: _Conversation, points: list[int]) -> None:
    whole, whole_out = _receive_checked(c.Connection(max_message=1000), [talk.wire])
    cut, cut_out = _receive_checked(c.Connection(max_message=1000), _cut(talk.wire, points))
    assert cut == whole
    assert cut_out == whole_out
    _parse_out(whole_out)
    _check_order(whole)
    ended = any(isinstance(e, c.ConnectionEnded) for e in whole)
    assert ended == talk.broken
    if ended:
        return
    for sid, messages in talk.sent.items():
        if sid in talk.refused:
            assert not [e for e in whole if getattr(e, "stream", None) == sid]
            continue
        assert c.RequestStarted(sid, PATH, talk.metadata[sid], None) in whole
        received = [e.data for e in whole if isinstance(e, c.MessageReceived) and e.stream == sid]
        if sid in talk.reset:  # RST_STREAM: what came before it, nothing after
            assert received == messages[: len(received)]
        else:
            assert received == messages


def _started(settings: dict[int, int] | None = None) -> c.Connection:
    conn = c.Connection(max_message=1000)
    block = _headers(hpack.Encoder())
    conn.receive(
        f.PREFACE + f.settings_frame(settings or {}) + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
    )
    conn.data_to_send()
    return conn


def test_a_window_update_past_2_31_is_a_flow_control_error() -> None:
    """Found by the property above: the window grew past 2^31-1 without an error (§6.9.1)."""
    conn = _started()
    [ended] = conn.receive(f.window_update_frame(0, f.MAX_WINDOW))
    assert isinstance(ended, c.ConnectionEnded)
    assert ended.code == f.FLOW_CONTROL_ERROR
    conn = _started()  # on a stream: that stream ends, the connection goes on
    assert conn.receive(f.window_update_frame(1, f.MAX_WINDOW)) == [c.StreamReset(1)]
    assert _parse_out(conn.data_to_send()) == [
        (f.RST_STREAM, 0, 1, f.FLOW_CONTROL_ERROR.to_bytes(4, "big"))
    ]
    assert conn.receive(f.frame(f.PING, 0, 0, b"p" * 8)) == []
    conn = _started({f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW - 100})  # or by SETTINGS (§6.9.2)
    assert conn.receive(f.window_update_frame(1, 50)) == []
    [ended] = conn.receive(f.settings_frame({f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW}))
    assert isinstance(ended, c.ConnectionEnded)
    assert ended.code == f.FLOW_CONTROL_ERROR


def test_a_second_end_of_input_resets_the_stream() -> None:
    """Found by the property above: HEADERS+END_STREAM again gave a second InputEnded, and the
    server ran the unary call once per copy (one request, many inferences)."""
    conn = _started()
    encoder = hpack.Encoder()
    end = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, encoder.encode([("x-t", "1")]))
    events = conn.receive(f.frame(f.DATA, 0, 1, _message(b"req")) + end)
    assert events == [c.MessageReceived(1, b"req"), c.InputEnded(1)]
    assert conn.receive(end) == [c.StreamReset(1)]
    assert _parse_out(conn.data_to_send()) == [
        (f.RST_STREAM, 0, 1, f.STREAM_CLOSED.to_bytes(4, "big"))
    ]
    # once more on the stream we reset: ignored (RFC 9113 §5.1), the connection goes on
    assert conn.receive(end) == []
    assert conn.data_to_send() == b""
    assert conn.receive(f.frame(f.PING, 0, 0, b"p" * 8)) == []
    assert _parse_out(conn.data_to_send())[0][0] == f.PING


_DAMAGE = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete"]),
        st.integers(0, 10**6),
        st.binary(min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(talk=_conversation(), damage=_DAMAGE, points=st.lists(st.integers(0, 10**6), max_size=6))
def test_a_damaged_conversation_makes_events_or_a_goaway(
    talk: _Conversation, damage: list[tuple[str, int, bytes]], points: list[int]
) -> None:
    """Valid frames with bytes flipped, inserted or cut: header blocks, lengths, flags go wrong."""
    wire = bytearray(talk.wire)
    for how, where, data in damage:
        at = len(f.PREFACE) + where % max(1, len(wire) - len(f.PREFACE))
        if how == "flip" and at < len(wire):
            wire[at] ^= data[0]
        elif how == "insert":
            wire[at:at] = data
        else:
            del wire[at : at + len(data)]
    conn = c.Connection(max_message=1000)
    events, out = _receive_checked(conn, _cut(bytes(wire), points))
    _check_order(events)
    frames = _parse_out(out)
    ended = [e for e in events if isinstance(e, c.ConnectionEnded)]
    if ended and ended[0].message != "the client sent GOAWAY":
        assert events[-1] == ended[0]
        assert frames[-1][0] == f.GOAWAY


# 3. Flow control ---------------------------------------------------------------------------------


@dataclass
class _Peer:
    """The client's view of its receive windows (RFC 9113 §6.9), checked against our DATA."""

    initial: int
    connection: int = f.DEFAULT_WINDOW
    streams: dict[int, int] = field(default_factory=dict)
    received: dict[int, bytes] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    max_frame: int = f.DEFAULT_MAX_FRAME

    def read(self, out: bytes) -> None:
        for kind, flags, sid, payload in _parse_out(out, self.max_frame):
            if kind == f.DATA:
                self.connection -= len(payload)
                self.streams[sid] -= len(payload)
                assert self.connection >= 0, "over the connection window"
                assert self.streams[sid] >= 0, f"over stream {sid}'s window"
                self.received[sid] = self.received.get(sid, b"") + payload
            elif kind == f.HEADERS and flags & f.END_STREAM:
                self.finished.add(sid)


_FLOW_OPS = st.lists(
    st.tuples(
        st.sampled_from(["window", "stream-window", "settings", "send", "reset"]),
        st.integers(0, 40_000),
        st.integers(0, 3),
    ),
    max_size=12,
)


@FUZZ
@given(
    initial=st.integers(0, 70_000),
    max_frame=st.integers(f.DEFAULT_MAX_FRAME, 40_000),
    ops=_FLOW_OPS,
)
def test_data_never_exceeds_the_peer_windows_and_all_of_it_goes_out(
    initial: int, max_frame: int, ops: list[tuple[str, int, int]]
) -> None:
    peer = _Peer(initial=initial, max_frame=max_frame)
    conn = c.Connection(max_message=1 << 20)
    settings = {f.INITIAL_WINDOW_SIZE: initial, f.MAX_FRAME_SIZE: max_frame}
    encoder = hpack.Encoder()
    opening = f.PREFACE + f.settings_frame(settings)
    sids = [1, 3, 5, 7]
    for sid in sids:
        opening += f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, _headers(encoder))
        peer.streams[sid] = initial
    assert not any(isinstance(e, c.ConnectionEnded) for e in conn.receive(opening))
    expected = {sid: b"" for sid in sids}
    reset: set[int] = set()
    peer.read(conn.data_to_send())

    def send(sid: int, size: int) -> None:
        payload = bytes([sid]) * size
        conn.send_message(sid, payload)
        expected[sid] += _message(payload)

    for op, amount, index in ops:
        sid = sids[index]
        if op == "send" and sid in conn.streams:
            send(sid, amount)
        elif op == "window" and amount:
            peer.connection += amount
            conn.receive(f.window_update_frame(0, amount))
        elif op == "stream-window" and amount and sid in conn.streams:
            peer.streams[sid] += amount
            conn.receive(f.window_update_frame(sid, amount))
        elif op == "settings":
            delta, peer.initial = amount - peer.initial, amount
            for open_sid in conn.streams:
                peer.streams[open_sid] += delta
            conn.receive(f.settings_frame({f.INITIAL_WINDOW_SIZE: amount}))
        elif op == "reset" and sid in conn.streams:
            reset.add(sid)  # its backlog is dropped with it
            conn.receive(f.rst_stream_frame(sid, f.CANCEL))
        peer.read(conn.data_to_send())
        # the edge's back-pressure reads one counter: it is every backlog's sum
        assert conn.backlogged == sum(conn.backlog(sid) for sid in sids)
    for sid in sids:
        if sid in conn.streams:
            send(sid, 100)
            conn.finish(sid, Status.OK)
    peer.read(conn.data_to_send())
    # enough credit for everything queued: all of it goes out, trailers last
    queued = sum(conn.backlog(sid) for sid in sids)
    big = queued + 1_000_000  # a stream window may be negative (SETTINGS)
    conn.receive(f.window_update_frame(0, big))
    for sid in list(conn.streams):
        peer.streams[sid] += big
        conn.receive(f.window_update_frame(sid, big))
    peer.connection += big
    peer.read(conn.data_to_send())
    assert not conn.streams
    assert conn.backlogged == 0
    assert peer.finished == set(sids) - reset
    for sid in set(sids) - reset:
        assert peer.received.get(sid, b"") == expected[sid]


# 4. A running agent ------------------------------------------------------------------------------


def _until_closed(raw: socket.socket) -> bytes:
    received = b""
    while chunk := raw.recv(65536):
        received += chunk
    return received


@scaled(0.25)
@given(
    prefix=st.sampled_from([b"", f.PREFACE, f.PREFACE + f.settings_frame({})]),
    body=st.lists(st.binary(max_size=64) | _ANY_FRAME, min_size=1, max_size=6).map(b"".join),
)
@example(prefix=f.PREFACE, body=f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x00\x02x"))
def test_random_bytes_on_the_grpc_port_close_the_connection_and_the_agent_serves_on(
    agent: RunningAgent, prefix: bytes, body: bytes
) -> None:
    assert agent.grpc_port is not None
    with socket.create_connection(("127.0.0.1", agent.grpc_port), timeout=30) as raw:
        raw.sendall(prefix + body)
        raw.shutdown(socket.SHUT_WR)  # an incomplete frame ends at our EOF, not at a timeout
        received = _until_closed(raw)  # returns: the server closed the connection
    frames, _ = f.split_frames(received, 1 << 24)
    assert frames
    assert frames[0][0] == f.SETTINGS  # our preface went out first
    verdict = c.Connection(max_message=1 << 20).receive(prefix + body)
    if any(isinstance(e, c.ConnectionEnded) and "client" not in e.message for e in verdict):
        assert frames[-1][0] == f.GOAWAY  # the server told the client why, as the core decided
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
        result = client.infer("mlp_classifier", [tensor])
        assert result.as_numpy("OUTPUT0") is not None
    finally:
        client.close()


def test_the_agent_fixture_serves_the_loop_engine() -> None:
    """The end-to-end property above is about the loop engine: the default one."""
    assert ServerConfig().grpc_engine == "loop"
