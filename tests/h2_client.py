"""A raw HTTP/2 client for conformance tests: frames out exactly as written, frames in as parsed.

Written apart from the loop engine's own framing (`agent.api.grpc.loop.frames`) so the tests do
not check the engine against itself: frame headers with `struct`, header blocks with `hpack`
(the reference HPACK library, a separate project from the engine). The verdicts follow h2spec's:
a *connection error* is a GOAWAY with the code and then the end of the connection; a *stream
error* is an RST_STREAM with the code while the connection still answers a PING; *ignored*
means the connection answers a PING with nothing but what it had to send in between.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
TIMEOUT_S = 10.0
_HEADER = struct.Struct(">BHBBI")
_pings = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def code(self) -> int:
        """RST_STREAM's or GOAWAY's error code."""
        at = 4 if self.kind == GOAWAY else 0
        return int.from_bytes(self.payload[at : at + 4], "big")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame's bytes; the stream id is written as given (reserved bit included)."""
    size = len(payload)
    return _HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream) + payload


def settings(values: dict[int, int] | Iterable[tuple[int, int]] = (), flags: int = 0) -> bytes:
    pairs = values.items() if isinstance(values, dict) else values
    return frame(SETTINGS, flags, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def priority(stream: int, depends_on: int, weight: int = 16) -> bytes:
    return frame(PRIORITY, 0, stream, struct.pack(">IB", depends_on, weight - 1))


def goaway(last_stream: int, code: int, stream: int = 0) -> bytes:
    return frame(GOAWAY, 0, stream, struct.pack(">II", last_stream, code))


def grpc_message(payload: bytes) -> bytes:
    """gRPC's length-prefixed message (uncompressed)."""
    return b"\0" + struct.pack(">I", len(payload)) + payload


def request_fields(path: str, **extra: str) -> list[tuple[str, str]]:
    """A gRPC call's request head."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra.items(),
    ]


class H2Client:
    """One connection to the server under test."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.encoder = hpack.Encoder()
        self.server_settings: dict[int, int] = {}
        self._buffer = b""

    def close(self) -> None:
        self.sock.close()

    # Sending ------------------------------------------------------------------------------

    def send(self, *data: bytes) -> None:
        """Write bytes; a server that already closed (after a connection error) is fine."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(b"".join(data))

    def handshake(self, values: dict[int, int] | None = None) -> None:
        """Preface and SETTINGS; wait for the server's SETTINGS and its ACK of ours."""
        self.send(PREFACE, settings(values or {}))
        got_settings = got_ack = False
        while not (got_settings and got_ack):
            item = self.read()
            assert item is not None, "the server closed during the handshake"
            if item.kind == SETTINGS and item.flags & ACK:
                got_ack = True
            elif item.kind == SETTINGS:
                got_settings = True
                for at in range(0, len(item.payload), 6):
                    key, value = struct.unpack_from(">HI", item.payload, at)
                    self.server_settings[key] = value
                self.send(settings(flags=ACK))

    def headers(
        self, stream: int, fields: list[tuple[str, str]], flags: int = END_HEADERS
    ) -> bytes:
        """A HEADERS frame with `fields` encoded by this connection's encoder."""
        return frame(HEADERS, flags, stream, self.block(fields))

    def block(self, fields: list[tuple[str, str]] | list[tuple[bytes, bytes]]) -> bytes:
        return bytes(self.encoder.encode(fields))

    # Receiving ----------------------------------------------------------------------------

    def read(self) -> Frame | None:
        """The next frame from the server; None when it closed the connection."""
        while True:
            if len(self._buffer) >= 9:
                high, low, kind, flags, stream = _HEADER.unpack_from(self._buffer)
                end = 9 + (high << 16 | low)
                if len(self._buffer) >= end:
                    payload, self._buffer = self._buffer[9:end], self._buffer[end:]
                    return Frame(kind, flags, stream & 0x7FFF_FFFF, payload)
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                assert not self._buffer, f"the server closed inside a frame: {self._buffer!r}"
                return None
            self._buffer += chunk

    def until(self, kind: int, stream: int | None = None) -> tuple[Frame, list[Frame]]:
        """Read up to the first frame of `kind` (on `stream`); it and the frames before it."""
        seen: list[Frame] = []
        while (item := self.read()) is not None:
            if item.kind == kind and (stream is None or item.stream == stream):
                return item, seen
            seen.append(item)
        raise AssertionError(f"closed before a frame of type {kind}; got {seen}")

    def ping(self) -> list[Frame]:
        """Send a PING and read up to its ACK; the frames before it (the connection lives)."""
        data = next(_pings).to_bytes(8, "big")
        self.send(frame(PING, 0, 0, data))
        while True:
            item, seen = self.until(PING)
            if item.flags & ACK and item.payload == data:
                return seen

    def response(self, stream: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """(headers, DATA, trailers) of a response, read to its END_STREAM; each header block
        is decoded by a fresh decoder (ours never index: RFC 7541 §6.2.2)."""
        blocks: list[dict[str, str]] = []
        data = block = b""
        ending = False  # END_STREAM seen on a HEADERS frame whose block continues
        while True:
            item = self.read()
            assert item is not None, "closed before the response ended"
            if item.stream != stream:
                continue
            assert item.kind in (HEADERS, CONTINUATION, DATA), item
            if item.kind == DATA:
                data += item.payload
                if item.flags & END_STREAM:
                    break
                continue
            block += item.payload
            ending = ending or bool(item.kind == HEADERS and item.flags & END_STREAM)
            if item.flags & END_HEADERS:
                blocks.append(decoded(block))
                block = b""
                if ending:
                    break
        headers = blocks[0] if blocks else {}
        trailers = blocks[-1]  # trailers-only: the one block is both
        return headers, data, trailers

    # Verdicts -----------------------------------------------------------------------------

    def connection_error(self, code: int) -> Frame:
        """The server sent GOAWAY with `code`, then closed the connection."""
        goaway_frame, _ = self.until(GOAWAY)
        assert goaway_frame.code == code, f"GOAWAY code {goaway_frame.code}, expected {code}"
        while (item := self.read()) is not None:
            assert item.kind != HEADERS or item.stream <= last_stream(goaway_frame), item
        return goaway_frame

    def stream_error(self, stream: int, code: int) -> None:
        """The server reset `stream` with `code`, and the connection goes on."""
        seen: list[Frame] = []
        while True:
            item = self.read()
            assert item is not None, f"closed, expected RST_STREAM {code} on {stream}: {seen}"
            assert item.kind != GOAWAY, f"a connection error ({item.code}), not a stream error"
            if item.kind == RST_STREAM and item.stream == stream:
                assert item.code == code, f"RST_STREAM code {item.code}, expected {code}"
                break
            seen.append(item)
        self.ping()

    def ignored(self) -> list[Frame]:
        """What came before a PING's answer holds no error: the last frames were ignored."""
        seen = self.ping()
        errors = [item for item in seen if item.kind in (GOAWAY, RST_STREAM)]
        assert not errors, errors
        return seen


def last_stream(goaway_frame: Frame) -> int:
    return int.from_bytes(goaway_frame.payload[:4], "big") & 0x7FFF_FFFF


def decoded(block: bytes) -> dict[str, str]:
    return {str(name): str(value) for name, value in hpack.Decoder().decode(block)}
