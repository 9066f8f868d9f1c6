"""HTTP/2 frames (RFC 9113 §4, §6) and gRPC's length-prefixed messages: pure bytes in, bytes out.

A frame is a 9-byte header (24-bit length, type, flags, 31-bit stream id) and its payload.
`split_frames` cuts the complete frames out of received bytes, `take_frame` one off the front of a
buffer (or None: wait for more);
the `*_frame` functions build the frames this server sends. Header blocks are HPACK: requests are
decoded with `hpack.Decoder` (in `connection`); responses are written here by hand as static-table
references and literals *without indexing*, so a response block never touches the peer's
dynamic table and the common ones are constant bytes.
"""

from __future__ import annotations

import struct
from typing import Final

from agent.api.grpc.status import Status

# Frame types (RFC 9113 §6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# SETTINGS identifiers (§6.5.2).
HEADER_TABLE_SIZE: Final = 0x1
ENABLE_PUSH: Final = 0x2
MAX_CONCURRENT_STREAMS: Final = 0x3
INITIAL_WINDOW_SIZE: Final = 0x4
MAX_FRAME_SIZE: Final = 0x5
MAX_HEADER_LIST_SIZE: Final = 0x6
NO_RFC7540_PRIORITIES: Final = 0x9  # RFC 9113 §5.3.2

# Error codes (§7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1

_HEADER = struct.Struct(">BHBBI")  # length as 8 + 16 bits, type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")
_GRPC_PREFIX = struct.Struct(">BI")  # compressed flag, message length

GRPC_PREFIX_SIZE: Final = 5


class FrameError(Exception):
    """The peer broke the framing rules: the connection ends with GOAWAY(`code`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Frame = tuple[int, int, int, bytes | memoryview]  # type, flags, stream id, payload


def take_frame(buffer: bytearray, max_size: int) -> tuple[int, int, int, bytes] | None:
    """The first complete frame of `buffer` as (type, flags, stream id, payload), removed from it.

    Returns None while the frame is incomplete.

    Raises:
        FrameError: a frame longer than `max_size` (our SETTINGS_MAX_FRAME_SIZE).
    """
    if len(buffer) < 9:
        return None
    high, low, kind, flags, stream = _HEADER.unpack_from(buffer)
    length = (high << 16) | low
    if length > max_size:
        raise FrameError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {max_size}")
    end = 9 + length
    if len(buffer) < end:
        return None
    with memoryview(buffer) as view:
        payload = bytes(view[9:end])  # one copy (a bytearray slice would be a second)
    del buffer[:end]
    return kind, flags, stream & 0x7FFF_FFFF, payload


def split_frames(data: bytes, max_size: int, start: int = 0) -> tuple[list[Frame], int]:
    """The complete frames of `data` from `start`, and where they end.

    DATA payloads are views of `data` (a call's messages are copied once, out of them); the
    other frames' payloads are bytes.

    Raises:
        FrameError: a frame longer than `max_size` (our SETTINGS_MAX_FRAME_SIZE).
    """
    frames: list[Frame] = []
    size = len(data)
    view = memoryview(data)
    while size - start >= 9:
        high, low, kind, flags, stream = _HEADER.unpack_from(view, start)
        length = (high << 16) | low
        if length > max_size:
            raise FrameError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {max_size}")
        end = start + 9 + length
        if end > size:
            break
        payload = view[start + 9 : end]
        frames.append(
            (kind, flags, stream & 0x7FFF_FFFF, payload if kind == DATA else bytes(payload))
        )
        start = end
    return frames, start


def missing(buffer: bytearray, max_size: int) -> int:
    """How many bytes the first frame in `buffer` still lacks (its header first); 0: complete.

    Raises:
        FrameError: a frame longer than `max_size`.
    """
    if len(buffer) < 9:
        return 9 - len(buffer)
    high, low, _, _, _ = _HEADER.unpack_from(buffer)
    length = (high << 16) | low
    if length > max_size:
        raise FrameError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {max_size}")
    return max(9 + int(length) - len(buffer), 0)


def frame(kind: int, flags: int, stream: int, payload: bytes | memoryview = b"") -> bytes:
    """One frame's bytes."""
    length = len(payload)
    return _HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream) + payload


def frame_header(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame header alone (the payload is written after it without a copy)."""
    return _HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream)


def strip_padding(
    flags: int, payload: bytes | memoryview, *, priority: bool = False
) -> bytes | memoryview:
    """A DATA or HEADERS payload without its padding (and HEADERS' priority fields).

    Raises:
        FrameError: the frame is too short for its pad length or priority fields
            (FRAME_SIZE_ERROR, RFC 9113 §4.2), or its padding is longer than it (PROTOCOL_ERROR).
    """
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, end - payload[0] if payload else 0
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if len(payload) < start:
        raise FrameError(FRAME_SIZE_ERROR, "frame too short for its pad length or priority")
    if end < start:
        raise FrameError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[start:end]


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


SETTINGS_ACK: Final = frame(SETTINGS, ACK, 0)


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    """Raises: FrameError: a payload that is not a whole number of 6-byte settings."""
    if len(payload) % 6:
        raise FrameError(FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6")
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def window_update_frame(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def parse_u32(payload: bytes | memoryview) -> int:
    """WINDOW_UPDATE's increment, RST_STREAM's code (the reserved bit cleared).

    Raises:
        FrameError: a payload that is not 4 bytes.
    """
    if len(payload) != 4:
        raise FrameError(FRAME_SIZE_ERROR, "expected a 4-byte payload")
    return int(_U32.unpack(payload)[0]) & 0x7FFF_FFFF


def rst_stream_frame(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway_frame(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream, code) + debug)


def ping_ack_frame(payload: bytes | memoryview) -> bytes:
    return frame(PING, ACK, 0, payload)


# HPACK by hand (RFC 7541): static-table index 8 is ":status: 200"; 31 is "content-type".


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (§5.1) with `first`'s high bits in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman (§6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


# ":status: 415" (name from static index 8, literal value): the answer to a request not gRPC.
STATUS_415: Final = b"\x08\x03415"
RESPONSE_HEADERS: Final = b"\x88" + b"\x0f\x10" + hpack_int(16, 7) + b"application/grpc"


def trailers_block(status: Status, message: str = "") -> bytes:
    """The trailers of a call: grpc-status and, when set, grpc-message (percent-encoded)."""
    block = literal(b"grpc-status", b"%d" % status)
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block


OK_TRAILERS: Final = trailers_block(Status.OK)


def percent_encode(message: str) -> bytes:
    """gRPC's grpc-message encoding: UTF-8, with '%' and bytes outside 0x20..0x7E as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def headers_frames(stream: int, block: bytes, *, end_stream: bool, max_frame: int) -> bytes:
    """A header block as HEADERS (+ CONTINUATION frames when it is over the peer's frame size)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, stream, block)
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(HEADERS, flags, stream, parts[0])]
    for i, part in enumerate(parts[1:], start=2):
        out.append(frame(CONTINUATION, END_HEADERS if i == len(parts) else 0, stream, part))
    return b"".join(out)


def grpc_prefix(length: int) -> bytes:
    """The 5-byte prefix of an uncompressed gRPC message."""
    return _GRPC_PREFIX.pack(0, length)


def parse_grpc_prefix(prefix: bytes | memoryview) -> tuple[bool, int]:
    """(compressed, length) of a gRPC message prefix."""
    compressed, length = _GRPC_PREFIX.unpack(prefix)
    return bool(compressed), int(length)


def parse_timeout(value: str) -> float | None:
    """A grpc-timeout header ("100m", "5S", ...) in seconds; None when malformed."""
    units = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    digits = value[:-1]  # ASCII: str.isdigit also takes "²", which int() refuses
    if not 1 <= len(digits) <= 8 or not digits.isascii() or not digits.isdigit():
        return None
    unit = units.get(value[-1])
    return None if unit is None else int(digits) * unit
