"""gRPC's length-prefixed messages out of one call's DATA, pure: bytes in, messages out.

Each message is a 5-byte prefix (compressed flag, 32-bit length) and its bytes. Invariants: a
message's length is checked at its prefix, so one over `max_message` is refused before its body
is buffered; a compressed message is inflated (gzip or deflate, the call's `grpc-encoding`) to at
most `max_message` bytes (a small message that inflates past it is refused the same way).
"""

from __future__ import annotations

import zlib
from collections import deque

from agent.api.grpc.loop import frames as f
from agent.api.grpc.status import Status, StatusError

__all__ = ["MessageReader"]

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # grpc-encoding: zlib's wbits


class MessageReader:
    """The messages of one call's request stream.

    DATA arrives as views of the read it came in, and a message is copied once, out of the
    views, when it is complete. What waits past the read is kept as views only when it is at
    least half of that read; less is copied out (`settle`), so a few bytes held for a call never
    keep a whole read alive: the memory behind what a connection holds stays within twice it.
    """

    __slots__ = ("_compressed", "_expect", "_held", "_owned", "_pieces", "encoding", "max_message")

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.encoding = "identity"  # the call's grpc-encoding
        self._pieces: deque[bytes | memoryview] = deque()
        self._owned = 0  # leading pieces that are ours (copies), not views of a read
        self._held = 0  # bytes in the pieces
        self._expect = -1  # length of the message being read; -1: at a prefix
        self._compressed = False

    @property
    def buffered(self) -> int:
        """Bytes held for messages not yet complete."""
        return self._held

    def discard(self) -> None:
        """Forget a refused call's unfinished message."""
        self._pieces.clear()
        self._owned = self._held = 0
        self._expect = -1

    @property
    def inside_message(self) -> bool:
        """Whether part of a message has arrived without its end."""
        return self._held > 0 or self._expect >= 0

    @property
    def unsettled(self) -> bool:
        """Whether views of the current read are held (`settle` copies them)."""
        return len(self._pieces) > self._owned

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        """The messages that `data` completes.

        Raises:
            StatusError: a message over the limit, compressed unreadably or with an
                encoding other than gzip and deflate.
        """
        if not self._held and self._expect < 0 and len(data) >= f.GRPC_PREFIX_SIZE:
            # The usual case: one whole message in one frame, copied once.
            compressed, length = f.parse_grpc_prefix(data[:5])
            if not compressed and length == len(data) - 5 and length <= self.max_message:
                return [bytes(data[5:])]
        if data:
            self._pieces.append(data)
            self._held += len(data)
        messages: list[bytes] = []
        while True:
            if self._expect < 0:
                if self._held < f.GRPC_PREFIX_SIZE:
                    return messages
                compressed, length = f.parse_grpc_prefix(self._take(f.GRPC_PREFIX_SIZE))
                if length > self.max_message:
                    raise StatusError(
                        Status.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({length} vs. {self.max_message})",
                    )
                self._expect, self._compressed = length, compressed
            if self._held < self._expect:
                return messages
            message = self._take(self._expect)
            self._expect = -1
            messages.append(self._inflate(message) if self._compressed else message)

    def settle(self, read: bytes) -> None:
        """At the end of `read`: keep the views of it held for an unfinished message if they
        are at least half of it, else copy them out."""
        pieces = self._pieces
        count = len(pieces) - self._owned
        if count <= 0:
            return
        tail = [pieces.pop() for _ in range(count)]
        tail.reverse()
        # Only views of this read count: a frame completed from the previous read is a copy.
        if 2 * sum(len(p) for p in tail if type(p) is memoryview and p.obj is read) >= len(read):
            pieces.extend(tail)
        else:
            pieces.append(b"".join(tail))
        self._owned = len(pieces)

    def _take(self, size: int) -> bytes:
        """The next `size` bytes held (there are at least that many), copied once."""
        pieces = self._pieces
        parts: list[bytes | memoryview] = []
        wanted = size
        while wanted:
            piece = pieces[0]
            if len(piece) <= wanted:
                parts.append(pieces.popleft())
                self._owned = max(self._owned - 1, 0)
                wanted -= len(piece)
            else:
                view = piece if type(piece) is memoryview else memoryview(piece)
                parts.append(view[:wanted])
                pieces[0] = view[wanted:]  # still ours if it was (a view of our copy)
                wanted = 0
        self._held -= size
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def _inflate(self, message: bytes) -> bytes:
        wbits = _WBITS.get(self.encoding)
        if wbits is None:
            raise StatusError(
                Status.UNIMPLEMENTED, f"Compression algorithm '{self.encoding}' is not supported"
            )
        inflater = zlib.decompressobj(wbits)
        try:
            inflated = inflater.decompress(message, self.max_message + 1)
        except zlib.error as exc:
            raise StatusError(Status.INTERNAL, f"Failed to decompress the message: {exc}") from None
        if len(inflated) > self.max_message:
            raise StatusError(
                Status.RESOURCE_EXHAUSTED,
                f"Received message larger than max (over {self.max_message} once inflated)",
            )
        if not inflater.eof:  # zlib returns what a cut stream holds without an error
            raise StatusError(Status.INTERNAL, "Failed to decompress the message: truncated")
        return inflated
