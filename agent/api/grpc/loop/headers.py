"""A client's header blocks, read (pure): HPACK-decoded, held to RFC 9113 §8's field rules, and
the few fields gRPC needs picked out.

Invariants:
* every block is decoded, in the order it came, even one whose stream is refused or reset: the
  HPACK table stays the client's (RFC 7541 §2.2); a block HPACK cannot decode loses it, so that
  is a connection error (COMPRESSION_ERROR, raised as `FrameError`);
* a block that breaks a field rule is *malformed* (RFC 9113 §8.1.1): `Head.malformed` (as a
  request's start) or `Head.malformed_trailers` (as its end) says why, and the caller answers
  with a stream error (PROTOCOL_ERROR); the connection goes on;
* a block made only of indexed fields leaves the table as it is, so the same bytes mean the same
  head again (a client repeats its blocks): it is read once and kept (at most `_CACHED_BLOCKS`;
  any block with a literal empties the cache, since the table may have changed).
"""

from __future__ import annotations

import re
from typing import Final

import hpack
from hpack import HPACKError

from agent.api.grpc.loop import frames as f

__all__ = ["Head", "HeaderReader"]

_HIGH_BYTES = bytes(range(0x80, 0x100))
_CACHED_BLOCKS = 64
# RFC 9113 §8.2.1: a name (a token, RFC 9110 §5.1: not empty) has no control, space, upper-case,
# DEL or high byte, and no colon (but a pseudo-header's leading one); a value has no NUL, CR or
# LF, and no space or tab at its ends. Checked once over the block's names and values joined,
# not field by field (a third of the cost): names with a valid separator, values between LFs
# (one inside a value shows as one too many).
_BAD_NAMES = re.compile(rb"[\x00-\x20:A-Z\x7f-\xff]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|\A[ \t]|[ \t]\Z")  # one value (the error path)
_REQUEST_PSEUDO: Final = frozenset({b":method", b":scheme", b":authority", b":path"})
# §8.2.2: HTTP/1.1's connection-specific fields have no meaning in HTTP/2.
_CONNECTION_SPECIFIC: Final = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)


class Head:
    """One header block, read: a call's request head, or its trailers."""

    __slots__ = (
        "content_length",
        "encoding",
        "grpc",
        "malformed",
        "malformed_trailers",
        "metadata",
        "path",
        "timeout_s",
    )

    def __init__(self) -> None:
        self.path = ""
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.timeout_s: float | None = None  # grpc-timeout; None: none, or malformed
        self.grpc = False  # content-type application/grpc (anything else: not a gRPC call)
        self.encoding = "identity"  # grpc-encoding: how the call's messages are compressed
        self.content_length: int | None = None
        self.malformed: str | None = None  # why it cannot start a request (None: it can)
        self.malformed_trailers: str | None = None  # why it cannot end one


class HeaderReader:
    """One connection's HPACK decoder and the heads it read (see the module doc)."""

    def __init__(self, max_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_list_size)
        self._cache: dict[bytes, Head] = {}

    def read(self, block: bytes) -> Head:
        """The head a complete header block carries.

        Raises:
            FrameError: HPACK cannot decode the block (COMPRESSION_ERROR).
        """
        head = self._cache.get(block)
        if head is not None:
            return head
        try:
            fields = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise f.FrameError(f.COMPRESSION_ERROR, f"bad header block: {exc}") from None
        head = _head(list(fields))
        if block.translate(None, _HIGH_BYTES):  # a literal: the table may have changed
            self._cache.clear()
        elif len(self._cache) < _CACHED_BLOCKS:
            self._cache[block] = head
        return head


def _head(fields: list[tuple[bytes, bytes]]) -> Head:
    head = Head()
    metadata: list[tuple[str, str]] = []
    pseudo: list[bytes] = []
    names: list[bytes] = []
    values: list[bytes] = []
    problem: str | None = None  # a rule broken whatever the block is (request or trailers)
    regular = False  # a regular field was seen (pseudo-headers come first)
    for name, value in fields:
        values.append(value)
        if name[:1] == b":":
            names.append(name[1:] or b" ")  # (a bare colon is no name)
            if regular:
                problem = problem or f"pseudo-header {_shown(name)} after a regular field"
            pseudo.append(name)
            if name == b":path":
                head.path = value.decode("latin-1")
            continue
        regular = True
        names.append(name or b" ")
        if name in _CONNECTION_SPECIFIC:
            problem = problem or f"connection-specific field {_shown(name)}"
        elif name == b"te":
            if value != b"trailers":
                problem = problem or "te other than trailers"
            continue
        elif name == b"content-type":
            head.grpc = value.startswith(b"application/grpc")
            continue
        elif name == b"grpc-timeout":
            head.timeout_s = f.parse_timeout(value.decode("latin-1"))
            continue
        elif name == b"content-length":
            if not value.isdigit():
                problem = problem or "content-length is not a number"
            else:
                head.content_length = int(value)
        elif name == b"grpc-encoding":
            head.encoding = value.decode("latin-1")
        metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    joined = b"\n" + b"\n".join(values) + b"\n"
    if (
        _BAD_NAMES.search(b"-".join(names))
        or b"\x00" in joined
        or b"\r" in joined
        or b"\n " in joined
        or b" \n" in joined
        or b"\n\t" in joined
        or b"\t\n" in joined
        or joined.count(b"\n") > len(values) + 1  # an LF inside a value
    ):
        problem = _invalid_field(fields)
    elif len(set(pseudo)) < len(pseudo):
        problem = problem or "a pseudo-header twice"
    head.metadata = tuple(metadata)
    head.malformed_trailers = problem or ("pseudo-header in trailers" if pseudo else None)
    head.malformed = problem or _request_problem(set(pseudo), head.path)
    return head


def _invalid_field(fields: list[tuple[bytes, bytes]]) -> str:
    """Which field breaks §8.2.1 (the error path: field by field)."""
    for name, value in fields:
        bare = name[1:] if name[:1] == b":" else name
        if not bare or _BAD_NAMES.search(bare) or _BAD_VALUE.search(value):
            return f"invalid field {_shown(name)}"
    return "invalid field"  # (not reached: the caller found one)


def _request_problem(pseudo: set[bytes], path: str) -> str | None:
    """What the pseudo-headers of a request head lack or have too many of (§8.3.1)."""
    unknown = pseudo - _REQUEST_PSEUDO
    if unknown:  # :status (a response's), :protocol (extended CONNECT: not served) or unknown
        return f"pseudo-header {_shown(min(unknown))} in a request"
    missing = {b":method", b":scheme", b":path"} - pseudo
    if missing:
        return f"no {_shown(min(missing))}"
    if not path:
        return "empty :path"
    return None


def _shown(name: bytes) -> str:
    """A field name for an error message (printable, short)."""
    return repr(name[:40].decode("latin-1"))
