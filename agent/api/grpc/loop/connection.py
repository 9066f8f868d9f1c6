"""One HTTP/2 connection of a gRPC server, as a pure state machine: bytes in, events and bytes out.

`receive(data)` parses what the client sent and returns what happened (`RequestStarted`,
`MessageReceived`, `InputEnded`, `StreamReset`, `ConnectionEnded`, `WindowOpened`); the server
answers with `send_message` and `finish`, and `data_to_send()` hands over the bytes to write. No
sockets, no clock: the edge (`server`) owns both.

Invariants:
* our SETTINGS go out first (`__init__`), with a 16 MiB stream window and a connection window
  raised to match, so a client sends a large tensor without waiting on WINDOW_UPDATEs; we give
  credit back once half of a window is consumed (not per request);
* a response never exceeds the peer's windows: what does not fit waits in the stream's backlog
  and goes out on WINDOW_UPDATE, its trailers after it; `backlogged` counts those bytes over
  all streams (the edge holds them, with its write buffer, to the connection's cap);
* a call's messages are cut out of its DATA by `messages.MessageReader` (the size limit at each
  prefix, gzip/deflate); one it refuses ends the call with its status (`StreamReset`); DATA is
  handed over as views of the read, so a message is copied once, when it is complete;
* RFC 9113's errors are told apart as it says: a broken frame, preface or header block (one HPACK
  cannot decode) ends the connection with GOAWAY (`ConnectionEnded`); a stream that breaks the
  rules (a frame after its end, a malformed request head, too many streams) gets RST_STREAM and
  the connection goes on; the test suite tests/agent/api/test_h2_conformance*.py holds it to that;
* a closed stream is remembered (the last `_CLOSED_MEMORY`) with how it closed: frames still in
  flight after our RST_STREAM are ignored, a frame after the client's own end or reset is a
  STREAM_CLOSED stream error, and HEADERS on an id never opened is a connection error (§5.1.1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.api.grpc.loop import frames as f
from agent.api.grpc.loop.headers import HeaderReader
from agent.api.grpc.loop.messages import MessageReader
from agent.api.grpc.status import Status, StatusError

OUR_WINDOW = 16 * 1024 * 1024
OUR_MAX_FRAME = 1024 * 1024
MAX_HEADER_BLOCK = 64 * 1024
# Closed streams remembered (§5.1): whether we reset them (their late frames are ignored) or they
# ended otherwise (a frame on them is a stream error). Older ones count as never opened.
_CLOSED_MEMORY = 256
_SELF_DEPENDENT = 0x100  # not a wire flag: a HEADERS frame whose priority names its own stream


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class RequestStarted:
    """A call's headers: `path` is "/package.Service/Method"."""

    stream: int
    path: str
    metadata: tuple[tuple[str, str], ...]
    timeout_s: float | None


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class MessageReceived:
    stream: int
    data: bytes


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class InputEnded:
    """The client half-closed the stream (END_STREAM): no more messages."""

    stream: int


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class StreamReset:
    """The call is over without an answer from the handler (client RST, or refused here)."""

    stream: int


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class ConnectionEnded:
    """GOAWAY was sent or received with an error: write what is pending, then close."""

    code: int
    message: str


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x
class WindowOpened:
    """The peer gave credit: backlogged responses moved on."""


Event = RequestStarted | MessageReceived | InputEnded | StreamReset | ConnectionEnded | WindowOpened


class _Stream:
    __slots__ = (
        "backlog",
        "headers_sent",
        "id",
        "queued",
        "reader",
        "recv_unacked",
        "remote_closed",
        "send_window",
        "to_receive",
        "trailers",
    )

    def __init__(self, stream_id: int, send_window: int, max_message: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_unacked = 0
        self.headers_sent = False
        self.remote_closed = False
        self.reader = MessageReader(max_message)
        self.backlog: deque[memoryview] = deque()
        self.queued = 0  # bytes in `backlog`
        self.trailers: bytes | None = None  # waiting for the backlog to drain
        self.to_receive: int | None = None  # what content-length has still to come (None: any)


class Connection:
    """The server side of one HTTP/2 connection carrying gRPC calls (see the module doc)."""

    def __init__(self, *, max_message: int, max_streams: int = 1024) -> None:
        self.max_message = max_message
        self.max_streams = max_streams
        self.handshaken = False  # the client's preface and first SETTINGS arrived
        self.closing = False  # GOAWAY sent: no new streams
        self.ended = False  # connection error: ignore everything after
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.opened = 0  # streams ever started (the edge's idle clock reads it)
        self._buffer = bytearray()
        self._unsettled: list[MessageReader] = []  # readers holding views of the current read
        self._preface = False
        self._out: list[bytes | memoryview] = []
        self._heads = HeaderReader(MAX_HEADER_BLOCK)
        self._continuing: tuple[int, int, bytearray] | None = None
        self._closed: dict[int, bool] = {}  # stream id -> whether we reset it (in close order)
        self._send_window = f.DEFAULT_WINDOW
        self._peer_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._recv_unacked = 0
        self._blocked: dict[int, _Stream] = {}
        self.backlogged = 0  # bytes in every stream's backlog: the edge's back-pressure counts it
        # Bytes held in unfinished messages over all streams. Credit is returned as DATA
        # arrives (holding it back would stall a message larger than the window), so this cap
        # bounds what one connection can make the server hold: one whole message of the
        # largest size plus a window's worth spread over the other calls.
        self.held = 0
        self.held_limit = max_message + OUR_WINDOW
        settings = {
            f.MAX_CONCURRENT_STREAMS: max_streams,
            f.INITIAL_WINDOW_SIZE: OUR_WINDOW,
            f.MAX_FRAME_SIZE: OUR_MAX_FRAME,
            f.MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK,
        }
        self._out.append(f.settings_frame(settings))
        self._out.append(f.window_update_frame(0, OUR_WINDOW - f.DEFAULT_WINDOW))

    # Input ------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """Parse bytes from the client; returns the events they make, in order."""
        if self.ended:
            return []
        buffer = self._buffer
        events: list[Event] = []
        try:
            if not self._preface:
                buffer += data
                if len(buffer) < len(f.PREFACE):
                    if not f.PREFACE.startswith(bytes(buffer)):
                        raise f.FrameError(f.PROTOCOL_ERROR, "not an HTTP/2 client preface")
                    return events
                if bytes(buffer[: len(f.PREFACE)]) != f.PREFACE:
                    raise f.FrameError(f.PROTOCOL_ERROR, "not an HTTP/2 client preface")
                data = bytes(buffer[len(f.PREFACE) :])
                buffer.clear()
                self._preface = True
            # A frame cut by the previous read is completed from the start of this one; the
            # rest is split where it lies. Only an incomplete tail waits in the buffer.
            start = 0
            first: tuple[int, int, int, bytes] | None = None
            if buffer:
                while start < len(data) and (need := f.missing(buffer, OUR_MAX_FRAME)):
                    buffer += memoryview(data)[start : start + need]
                    start = min(start + need, len(data))
                first = f.take_frame(buffer, OUR_MAX_FRAME)
                if first is None:
                    return events
            # The rest is split before anything is handled: a broken frame in this read ends
            # the connection before any of the read's frames takes effect.
            parsed, used = f.split_frames(data, OUR_MAX_FRAME, start)
            if used < len(data):
                buffer += memoryview(data)[used:]
            if first is not None:
                parsed.insert(0, first)
            for frame in parsed:
                self._frame(*frame, events)
                if self.ended:
                    break
        except f.FrameError as exc:
            self._connection_error(exc.code, exc.message, events)
        finally:
            if self._unsettled:  # what waits for the next read: views of this one, or copies
                for reader in self._unsettled:
                    reader.settle(data)
                self._unsettled.clear()
        return events

    def _frame(
        self, kind: int, flags: int, sid: int, payload: bytes | memoryview, events: list[Event]
    ) -> None:
        if not self.handshaken:
            if kind != f.SETTINGS or flags & f.ACK:
                raise f.FrameError(f.PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self.handshaken = True
        if self._continuing is not None and kind != f.CONTINUATION:
            raise f.FrameError(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == f.DATA:
            self._data(flags, sid, payload, events)
        elif kind == f.HEADERS:
            if sid == 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "HEADERS on stream 0")
            block = bytes(f.strip_padding(flags, payload, priority=True))  # bytes already
            if len(block) > MAX_HEADER_BLOCK:  # what the CONTINUATION path caps too
                raise f.FrameError(f.ENHANCE_YOUR_CALM, "header block too large")
            if flags & f.PRIORITY_FLAG and _depends_on_itself(sid, flags, payload):
                flags |= _SELF_DEPENDENT  # carried to the end of the block
            if flags & f.END_HEADERS:
                self._headers(sid, flags, block, events)
            else:
                self._continuing = (sid, flags, bytearray(block))
        elif kind == f.CONTINUATION:
            if self._continuing is None or self._continuing[0] != sid:
                raise f.FrameError(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
            _, first_flags, pending = self._continuing
            pending += payload
            if len(pending) > MAX_HEADER_BLOCK:
                raise f.FrameError(f.ENHANCE_YOUR_CALM, "header block too large")
            if flags & f.END_HEADERS:
                self._continuing = None
                self._headers(sid, first_flags, bytes(pending), events)
        elif kind == f.SETTINGS:
            if sid != 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "SETTINGS on a stream")
            if not flags & f.ACK:
                self._settings(f.parse_settings(payload), events)
                self._out.append(f.SETTINGS_ACK)
            elif payload:
                raise f.FrameError(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, f.parse_u32(payload), events)
        elif kind == f.PING:
            if sid != 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise f.FrameError(f.FRAME_SIZE_ERROR, "PING payload must be 8 bytes")
            if not flags & f.ACK:
                self._out.append(f.ping_ack_frame(payload))
        elif kind == f.PRIORITY:  # RFC 9113 deprecates its scheme; its framing rules remain
            if sid == 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(sid, f.FRAME_SIZE_ERROR, events)
            elif int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF == sid:
                self._stream_error(sid, f.PROTOCOL_ERROR, events)  # §5.3.1: not on itself
        elif kind == f.RST_STREAM:
            if sid == 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
            f.parse_u32(payload)
            if self._idle(sid):
                raise f.FrameError(f.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
            if (dropped := self.streams.pop(sid, None)) is not None:
                self.held -= dropped.reader.buffered
                self._forget_backlog(dropped)
                self._blocked.pop(sid, None)
                self._remember(sid, reset_here=False)
                events.append(StreamReset(sid))
        elif kind == f.GOAWAY:
            if sid != 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise f.FrameError(f.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self.closing = True  # the client opens no more streams; ours finish
            code = int.from_bytes(payload[4:8], "big")
            if code != f.NO_ERROR:  # (an unknown code counts as an error: §7)
                self.ended = True
                events.append(ConnectionEnded(code, "the client sent GOAWAY"))
        elif kind == f.PUSH_PROMISE:
            raise f.FrameError(f.PROTOCOL_ERROR, "a client cannot push")
        # Unknown frame types are ignored (§5.5).

    def _idle(self, sid: int) -> bool:
        """Whether a (non-zero) stream id is one the client has not opened yet (§5.1)."""
        return sid % 2 == 0 or sid > self.last_stream

    def _remember(self, sid: int, *, reset_here: bool) -> None:
        """A stream closed: remember how, for the frames that may still come on it."""
        closed = self._closed
        closed[sid] = reset_here
        if len(closed) > _CLOSED_MEMORY:
            del closed[next(iter(closed))]

    def _stream_error(self, sid: int, code: int, events: list[Event]) -> None:
        """A stream error on any stream (§5.4.2): RST_STREAM; an open one's call is over. An idle
        stream cannot be reset (§6.4): its error ends the connection (§5.4.1 allows it)."""
        stream = self.streams.get(sid)
        if stream is not None:
            self._reset(stream, code, events)
        elif self._idle(sid):
            raise f.FrameError(code, f"a stream error on idle stream {sid}")
        else:
            self._out.append(f.rst_stream_frame(sid, code))
            self._remember(sid, reset_here=True)

    def _headers(self, sid: int, flags: int, block: bytes, events: list[Event]) -> None:
        self_dependent = flags & _SELF_DEPENDENT
        head = self._heads.read(block)  # first: every block is decoded, whatever it opens
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client
            if stream.remote_closed:  # §5.1: no second end (it would start the call again)
                self._reset(stream, f.STREAM_CLOSED, events)
            elif not flags & f.END_STREAM or head.malformed_trailers or self_dependent:
                self._reset(stream, f.PROTOCOL_ERROR, events)  # §8.1: trailers end the stream
            else:
                self._remote_end(stream, events)
            return
        if sid % 2 == 0:
            raise f.FrameError(f.PROTOCOL_ERROR, f"stream {sid} cannot be opened")
        if sid <= self.last_stream:
            how = self._closed.get(sid)
            if how is None:  # §5.1.1: a new stream's id is above every one opened before
                raise f.FrameError(f.PROTOCOL_ERROR, f"stream {sid} opened after a higher one")
            if not how:  # closed (not by us): that stream's error; after our reset: ignored
                self._stream_error(sid, f.STREAM_CLOSED, events)
            return
        self.last_stream = sid
        if head.malformed is not None or self_dependent:  # §8.1.1, §5.3.1: its stream's error
            self._stream_error(sid, f.PROTOCOL_ERROR, events)
            return
        if not head.grpc:  # not gRPC (a browser, curl): HTTP's answer, as grpc servers give
            self._out.append(f.frame(f.HEADERS, f.END_STREAM | f.END_HEADERS, sid, f.STATUS_415))
            if not flags & f.END_STREAM:  # the client may stop sending (§8.1)
                self._out.append(f.rst_stream_frame(sid, f.NO_ERROR))
            self._remember(sid, reset_here=not flags & f.END_STREAM)
            return
        if self.closing or len(self.streams) >= self.max_streams:
            self._stream_error(sid, f.REFUSED_STREAM, events)
            return
        stream = _Stream(sid, self._peer_window, self.max_message)
        stream.reader.encoding = head.encoding
        stream.to_receive = head.content_length
        self.streams[sid] = stream
        self.opened += 1
        events.append(RequestStarted(sid, head.path, head.metadata, head.timeout_s))
        if flags & f.END_STREAM:
            self._remote_end(stream, events)

    def _data(self, flags: int, sid: int, payload: bytes | memoryview, events: list[Event]) -> None:
        if sid == 0:
            raise f.FrameError(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_unacked += size
        if self._recv_unacked >= OUR_WINDOW // 2:
            self._out.append(f.window_update_frame(0, self._recv_unacked))
            self._recv_unacked = 0
        if flags & f.PADDED:
            payload = f.strip_padding(flags, payload)
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise f.FrameError(f.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            if not self._closed.get(sid, False):  # §6.1; after our reset: ignored
                self._stream_error(sid, f.STREAM_CLOSED, events)
            return  # its credit is returned above
        if stream.remote_closed:  # §5.1 half-closed (remote)
            self._reset(stream, f.STREAM_CLOSED, events)
            return
        if stream.to_receive is not None:  # §8.1.1: no more than content-length said
            stream.to_receive -= len(payload)
            if stream.to_receive < 0:
                self._reset(stream, f.PROTOCOL_ERROR, events)
                return
        if not flags & f.END_STREAM:
            stream.recv_unacked += size
            if stream.recv_unacked >= OUR_WINDOW // 2:
                self._out.append(f.window_update_frame(sid, stream.recv_unacked))
                stream.recv_unacked = 0
        reader = stream.reader
        held_before = reader.buffered
        settled = not reader.unsettled
        try:
            for message in reader.feed(payload):
                events.append(MessageReceived(sid, message))
            if settled and reader.unsettled:
                self._unsettled.append(reader)
        except StatusError as refused:
            self.held -= held_before
            reader.discard()
            self._refuse(stream, refused.status, refused.message)
            events.append(StreamReset(sid))
            return
        self.held += reader.buffered - held_before
        if self.held > self.held_limit:
            self._refuse(
                stream,
                Status.RESOURCE_EXHAUSTED,
                f"the connection holds more than {self.held_limit} bytes of unfinished messages",
            )
            events.append(StreamReset(sid))
            return
        if flags & f.END_STREAM:
            self._remote_end(stream, events)

    def _remote_end(self, stream: _Stream, events: list[Event]) -> None:
        if stream.to_receive:  # §8.1.1: less than content-length said
            self._reset(stream, f.PROTOCOL_ERROR, events)
            return
        stream.remote_closed = True
        if stream.reader.inside_message:
            self._refuse(stream, Status.INTERNAL, "the request ended inside a message")
            events.append(StreamReset(stream.id))
            return
        events.append(InputEnded(stream.id))

    def _settings(self, settings: list[tuple[int, int]], events: list[Event]) -> None:
        for key, value in settings:
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.FrameError(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_window
                self._peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > f.MAX_WINDOW:  # §6.9.2
                        raise f.FrameError(f.FLOW_CONTROL_ERROR, "a stream window over 2^31-1")
                if delta > 0:
                    self._flush_blocked(events)
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise f.FrameError(f.PROTOCOL_ERROR, "invalid SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key in (f.ENABLE_PUSH, f.NO_RFC7540_PRIORITIES) and value > 1:
                raise f.FrameError(f.PROTOCOL_ERROR, f"SETTINGS {key:#x} must be 0 or 1")
            # Our header blocks never index: the peer's HEADER_TABLE_SIZE does not concern them.
            # Unknown settings are ignored (§6.5.2).

    def _window_update(self, sid: int, increment: int, events: list[Event]) -> None:
        if sid == 0:
            if increment == 0:
                raise f.FrameError(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise f.FrameError(f.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
        elif (stream := self.streams.get(sid)) is not None:
            if increment == 0:  # §6.9: on a stream, that stream's error
                self._reset(stream, f.PROTOCOL_ERROR, events)
                return
            stream.send_window += increment
            if stream.send_window > f.MAX_WINDOW:  # §6.9.1: that stream ends, not the connection
                self._reset(stream, f.FLOW_CONTROL_ERROR, events)
                return
        elif self._idle(sid):
            raise f.FrameError(f.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
        else:
            return  # a closed stream: it may come for a while (§5.1)
        if self._blocked:
            self._flush_blocked(events)

    def _reset(self, stream: _Stream, code: int, events: list[Event]) -> None:
        """A stream error (§5.4.2): RST_STREAM, the call is over, the connection goes on."""
        del self.streams[stream.id]
        self.held -= stream.reader.buffered
        self._forget_backlog(stream)
        self._blocked.pop(stream.id, None)
        self._out.append(f.rst_stream_frame(stream.id, code))
        self._remember(stream.id, reset_here=True)
        events.append(StreamReset(stream.id))

    def _connection_error(self, code: int, message: str, events: list[Event]) -> None:
        self._out.append(f.goaway_frame(self.last_stream, code, message.encode()[:256]))
        self.ended = True
        self.closing = True
        events.append(ConnectionEnded(code, message))

    # Output -----------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes to write now (and forget)."""
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def backlog(self, sid: int) -> int:
        """Bytes of a stream waiting for the peer's window."""
        stream = self.streams.get(sid)
        return stream.queued if stream is not None else 0

    def send_message(self, sid: int, message: bytes) -> None:
        """One gRPC message on a stream (the response headers first, once)."""
        stream = self.streams.get(sid)
        if stream is None:
            return  # reset meanwhile
        if not stream.headers_sent:
            stream.headers_sent = True
            self._out.append(
                f.headers_frames(sid, f.RESPONSE_HEADERS, end_stream=False, max_frame=16_384)
            )
        data = memoryview(f.grpc_prefix(len(message)) + message)
        if stream.backlog:
            self._queue(stream, data)
        else:
            self._send_data(stream, data)

    def finish(self, sid: int, status: Status, message: str = "") -> None:
        """End a call with its status (trailers-only when nothing was sent)."""
        stream = self.streams.get(sid)
        if stream is None:
            return
        if stream.headers_sent:
            block = f.OK_TRAILERS if status == Status.OK else f.trailers_block(status, message)
        else:
            stream.headers_sent = True
            block = f.RESPONSE_HEADERS + f.trailers_block(status, message)
        trailers = f.headers_frames(sid, block, end_stream=True, max_frame=self._peer_max_frame)
        if stream.backlog:
            stream.trailers = trailers
        else:
            self._close(stream, trailers)

    def goaway(self, message: str = "") -> None:
        """Stop taking streams; those open finish (graceful close, idle close)."""
        if not self.closing:
            self.closing = True
            self._out.append(f.goaway_frame(self.last_stream, f.NO_ERROR, message.encode()))

    def _refuse(self, stream: _Stream, status: Status, message: str) -> None:
        self._forget_backlog(stream)
        self._blocked.pop(stream.id, None)
        stream.headers_sent, was_sent = True, stream.headers_sent
        block = (b"" if was_sent else f.RESPONSE_HEADERS) + f.trailers_block(status, message)
        trailers = f.headers_frames(
            stream.id, block, end_stream=True, max_frame=self._peer_max_frame
        )
        self._close(stream, trailers)

    def _close(self, stream: _Stream, trailers: bytes) -> None:
        self._out.append(trailers)
        if not stream.remote_closed:  # the client may stop sending (as grpc core does)
            self._out.append(f.rst_stream_frame(stream.id, f.NO_ERROR))
        del self.streams[stream.id]
        self.held -= stream.reader.buffered
        self._forget_backlog(stream)
        self._blocked.pop(stream.id, None)
        self._remember(stream.id, reset_here=not stream.remote_closed)

    def _send_data(self, stream: _Stream, data: memoryview) -> None:
        size = min(len(data), self._send_window, stream.send_window)
        if size > 0:
            limit = self._peer_max_frame
            for start in range(0, size, limit):
                chunk = data[start : min(start + limit, size)]
                self._out.append(f.frame_header(f.DATA, 0, stream.id, len(chunk)))
                self._out.append(chunk)
            self._send_window -= size
            stream.send_window -= size
        if size < len(data):
            self._queue(stream, data[max(size, 0) :])
            self._blocked[stream.id] = stream

    def _queue(self, stream: _Stream, part: memoryview) -> None:
        stream.backlog.append(part)
        stream.queued += len(part)
        self.backlogged += len(part)

    def _forget_backlog(self, stream: _Stream) -> None:
        stream.backlog.clear()
        self.backlogged -= stream.queued
        stream.queued = 0

    def _flush_blocked(self, events: list[Event]) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                break
            del self._blocked[stream.id]
            backlog, stream.backlog = stream.backlog, deque()
            self.backlogged -= stream.queued
            stream.queued = 0
            while backlog and not stream.backlog:
                self._send_data(stream, backlog.popleft())
            for part in backlog:
                self._queue(stream, part)
            if stream.backlog:
                self._blocked[stream.id] = stream
            elif stream.trailers is not None:
                self._close(stream, stream.trailers)
        events.append(WindowOpened())


def _depends_on_itself(sid: int, flags: int, payload: bytes | memoryview) -> bool:
    """Whether a HEADERS frame's priority fields (there: `strip_padding` checked) make its
    stream depend on itself (§5.3.1)."""
    start = 1 if flags & f.PADDED else 0
    return int.from_bytes(payload[start : start + 4], "big") & 0x7FFF_FFFF == sid
