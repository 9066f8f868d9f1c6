"""gRPC's length-prefixed messages out of one call's DATA, pure: bytes in, messages out.

Each message is a 5-byte prefix (compressed flag, 32-bit length) and its bytes. Invariants: a
message's length is checked at its prefix, so one over `max_message` is refused before its body
is buffered; a compressed message is inflated (gzip or deflate, the call's `grpc-encoding`) to at
most `max_message` bytes (a small message that inflates past it is refused the same way).
"""

from __future__ import annotations

import zlib

from agent.api.grpc_loop import frames as f

__all__ = ["CallRefusedError", "MessageReader"]

_RESOURCE_EXHAUSTED, _UNIMPLEMENTED, _INTERNAL = 8, 12, 13
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # grpc-encoding: zlib's wbits


class CallRefusedError(Exception):
    """The call ends with this gRPC status (its messages cannot be read)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class MessageReader:
    """The messages of one call's request stream."""

    __slots__ = ("_body", "_compressed", "_expect", "encoding", "max_message")

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.encoding = "identity"  # the call's grpc-encoding
        self._body = bytearray()
        self._expect = -1  # length of the message being read; -1: at a prefix
        self._compressed = False

    @property
    def buffered(self) -> int:
        """Bytes held for messages not yet complete."""
        return len(self._body)

    def discard(self) -> None:
        """Forget a refused call's unfinished message."""
        self._body = bytearray()
        self._expect = -1

    @property
    def inside_message(self) -> bool:
        """Whether part of a message has arrived without its end."""
        return bool(self._body)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages that `data` completes.

        Raises:
            CallRefusedError: a message over the limit, compressed unreadably or with an
                encoding other than gzip and deflate.
        """
        if not self._body and len(data) >= f.GRPC_PREFIX_SIZE:
            # The usual case: one whole message in one frame, taken without a copy.
            compressed, length = f.parse_grpc_prefix(data[:5])
            if not compressed and length == len(data) - 5 and length <= self.max_message:
                return [data[5:]]
        body = self._body
        body += data
        messages: list[bytes] = []
        while True:
            if self._expect < 0:
                if len(body) < f.GRPC_PREFIX_SIZE:
                    return messages
                compressed, length = f.parse_grpc_prefix(bytes(body[:5]))
                if length > self.max_message:
                    raise CallRefusedError(
                        _RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({length} vs. {self.max_message})",
                    )
                self._expect, self._compressed = length, compressed
            end = 5 + self._expect
            if len(body) < end:
                return messages
            with memoryview(body) as view:
                message = bytes(view[5:end])  # one copy (a bytearray slice would be a second)
            del body[:end]
            self._expect = -1
            messages.append(self._inflate(message) if self._compressed else message)

    def _inflate(self, message: bytes) -> bytes:
        wbits = _WBITS.get(self.encoding)
        if wbits is None:
            raise CallRefusedError(
                _UNIMPLEMENTED, f"Compression algorithm '{self.encoding}' is not supported"
            )
        inflater = zlib.decompressobj(wbits)
        try:
            inflated = inflater.decompress(message, self.max_message + 1)
        except zlib.error as exc:
            raise CallRefusedError(_INTERNAL, f"Failed to decompress the message: {exc}") from None
        if len(inflated) > self.max_message:
            raise CallRefusedError(
                _RESOURCE_EXHAUSTED,
                f"Received message larger than max (over {self.max_message} once inflated)",
            )
        if not inflater.eof:  # zlib returns what a cut stream holds without an error
            raise CallRefusedError(_INTERNAL, "Failed to decompress the message: truncated")
        return inflated
