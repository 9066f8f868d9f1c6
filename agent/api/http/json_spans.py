"""Large JSON infer bodies decoded within about three times their size.

`json.loads` turns every number of a tensor's `"data"` into a Python object (a float is 24 bytes
plus an 8-byte list slot), so a 57 MiB body of FP32 numbers cost over 300 MiB before it was even
checked against the limits. For a body of at least `SPLICE_MIN_BYTES`, the codec asks this module
to *splice* it first:

1. `splice` scans the body's structure (strings skipped whole, never their contents) for the
   value of `inputs[i].data`. Where that value is an array holding only numbers and arrays
   (JSON number characters, brackets, commas, whitespace) and is rectangular, it is cut out of
   the body and a placeholder string takes its place. Only its extent and shape are read here:
   no number is parsed.
2. The codec parses the spliced body (small: names, shapes, parameters) with `json.loads`, checks
   each input's header and its declared size against the limits as before, so a shape over
   `server.max_request_bytes` is refused (413) before its data is read.
3. `SplicedData.tensor` converts one cut-out array straight into the numpy array of the input's
   datatype, a chunk of `CHUNK_BYTES` at a time: each chunk is parsed by `json.loads` itself (so
   what is accepted is exactly JSON: no `+1`, `01`, `.5`, `NaN` inside a span, which the scan
   leaves to `json.loads` anyway) and written into the preallocated result.

Peak memory is then the body, the result array and one chunk's Python objects: about 1.4x the
body for FP32 data written as typical floats, at most 3x for FP32 written as one digit per
element (`0,0,...`: 4 result bytes per 2 body bytes), and the declared-shape limit caps the
result whatever the text.

Why not a library: orjson and msgspec still build a Python object per number; pysimdjson's DOM
(`as_buffer` would give a flat buffer) keeps a tape of 16 bytes per number, 8x a body of
one-digit numbers, and parses `NaN` and integers beyond 64 bits differently from `json.loads`;
ijson yields a Python object per number through an event loop of its own. Chunked `json.loads`
keeps the old parser's exact acceptance and values, with no new dependency.

Same answers as the plain path, always: every value is parsed by `json.loads` as before, and
the numpy conversion follows the plain path's rules over the whole array (an integer for a float
datatype is converted as numpy would convert the whole list: all-integer data through int64, any
float present through float64). An array the scan does not cut out (ragged
nesting, `NaN`, booleans, strings, more than 32 levels or 65536 arrays) stays in the document
and is parsed with it; a span holding an integer beyond int64 is handed back to the plain path
(`json.loads` of the span, then `tensor_from_json`). A body that is not valid JSON is decoded
again by the plain path, so its error message (with its line and column) is the same; the codec
also checks every span's syntax before it reports any other 400, so a malformed body is reported
as malformed first. The one difference: a declared shape over the limits is refused (413)
before the data is parsed, so a body both over the limit and malformed in its data gets the 413.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from agent.errors import InvalidInputError
from agent.tensors import datatypes

__all__ = ["CHUNK_BYTES", "SPLICE_MIN_BYTES", "MalformedSpanError", "SplicedData", "splice"]

# Bodies smaller than this take the plain path: its cost is small, and its CPU per request lower.
SPLICE_MIN_BYTES = 64 * 1024

# How much of an array's text is parsed at once: its Python objects are the scratch memory.
CHUNK_BYTES = 256 * 1024

# The scan gives up (the plain path decodes) beyond this many structural tokens outside the data
# arrays, or this many arrays inside one of them, or nesting deeper than numpy's 32 dimensions.
_MAX_TOKENS = 1 << 16
_MAX_ARRAYS = 1 << 16
_MAX_DEPTH = 32

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*+"|[\[\]{}:,]', re.DOTALL)
_WS = re.compile(rb"[ \t\n\r]*")
# Characters a span may hold: JSON number characters, brackets, commas and whitespace.
_RUN = re.compile(rb"[\[\]0-9eE+\-., \t\n\r]*")
_NO_BRACKETS = bytes.maketrans(b"[]", b"  ")
_CLOSE = re.compile(rb"\]")
_OPEN = re.compile(rb"\[")
_FLOAT_MARK = re.compile(rb"[.eE]")
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)
_COMMA = re.compile(rb",")

# A view of the body (the infer lane hands its receive buffer over as one): `re` reads it in
# place, and only chunks of it are ever copied.
Body = bytes | memoryview


class MalformedSpanError(Exception):
    """A span is not valid JSON: the body is not, and the plain path reports it."""


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    end: int
    shape: tuple[int, ...]  # the nesting's shape (rectangular)
    count: int  # numbers in it


class SplicedData:
    """The arrays cut out of one body, by their placeholder strings in the spliced document."""

    __slots__ = ("_body", "_spans")

    def __init__(self, body: memoryview, spans: dict[str, _Span]) -> None:
        self._body = body
        self._spans = spans

    def __bool__(self) -> bool:
        return bool(self._spans)

    def owns(self, value: object) -> bool:
        """Whether a parsed `data` value is one of this body's placeholders."""
        return isinstance(value, str) and value in self._spans

    def check_syntax(self) -> None:
        """Parse every span's numbers (discarding them), as `json.loads` of the body would.

        Raises:
            MalformedSpanError: a span is not valid JSON.
        """
        for span in self._spans.values():
            for _ in self._chunks(span):
                pass

    def tensor(
        self,
        placeholder: str,
        datatype: str,
        shape: tuple[int, ...],
        name: str,
        plain: Callable[[object, str, tuple[int, ...], str], np.ndarray],
    ) -> np.ndarray:
        """The array a placeholder stands for, as `plain` (the codec's JSON conversion) would
        give it from the parsed values, with the same errors.

        Raises:
            InvalidInputError: values of the wrong kind, range or count.
            MalformedSpanError: the span is not valid JSON.
        """
        span = self._spans[placeholder]
        count = 1
        for dim in shape:
            count *= dim
        body = self._body
        if span.count == 0 or datatype in ("BYTES", "BOOL"):
            if span.count:  # numbers where strings or booleans belong
                kind = "strings" if datatype == "BYTES" else "true or false"
                raise InvalidInputError(f"input '{name}': {datatype} data must be {kind}")
            return plain(np.empty(span.shape).tolist(), datatype, shape, name)
        dtype = datatypes.BY_KSERVE[datatype].numpy
        mixed = _FLOAT_MARK.search(body, span.start, span.end) is not None
        integral = dtype.kind in "iu"
        if integral and mixed:  # a float among the values: the plain path's kind error
            raise InvalidInputError(f"input '{name}': {datatype} data must be integers")
        # A count that does not match is an error once the values are checked: nothing is kept.
        out = np.empty(span.count, dtype=dtype) if span.count == count else None
        info = np.iinfo(dtype) if integral else None
        done = 0
        for values in self._chunks(span):
            chunk = np.asarray(values)
            # An integer beyond int64 makes numpy's list uint64, float64 or object: the plain
            # path's rules then depend on every value, so it decodes this span. (float64 is
            # right only where a float is in the chunk: numpy converts each int to float.)
            if chunk.dtype != _INT64 and (
                chunk.dtype != _FLOAT64 or not any(type(v) is float for v in values)
            ):
                return plain(self._values(span), datatype, shape, name)
            if mixed:  # ints among floats: numpy converts the whole list to float64
                chunk = chunk.astype(np.float64)
            if info is not None and (int(chunk.min()) < info.min or int(chunk.max()) > info.max):
                raise InvalidInputError(
                    f"input '{name}': a value is outside the range of {datatype} "
                    f"[{info.min}, {info.max}]"
                )
            if out is not None:
                with np.errstate(over="ignore"):  # past FP16/FP32's range: infinity, as plain
                    out[done : done + chunk.size] = chunk
            done += chunk.size
        if out is None:
            raise InvalidInputError(
                f"input '{name}' has {span.count} elements but shape {list(shape)} needs {count}"
            )
        return out.reshape(shape)

    def _values(self, span: _Span) -> object:
        try:
            return json.loads(bytes(self._body[span.start : span.end]))
        except ValueError:
            raise MalformedSpanError from None

    def _chunks(self, span: _Span) -> Iterator[list[object]]:
        """The span's numbers, flat, parsed a chunk at a time (brackets blanked: the scan
        checked the nesting; each chunk starts and ends at a comma between numbers)."""
        if span.count == 0:
            return
        body = self._body
        pos = span.start
        while pos < span.end:
            found = _COMMA.search(body, min(pos + CHUNK_BYTES, span.end), span.end)
            cut = span.end if found is None else found.start()
            text = b"[" + bytes(body[pos:cut]).translate(_NO_BRACKETS) + b"]"
            try:
                values = json.loads(text)
            except ValueError:
                raise MalformedSpanError from None
            if not values:  # an empty piece: "1,,2" (numbers are all a span's text can hold)
                raise MalformedSpanError
            yield values
            pos = cut + 1


def splice(raw: Body) -> tuple[bytes, SplicedData] | None:
    """The body with each numeric `inputs[i].data` array replaced by a placeholder string.

    Returns:
        The spliced body and its cut-out arrays; None when nothing was cut out (or the scan
        gave up): the body is decoded as it is.
    """
    body = memoryview(raw)
    frames: list[list[bytes | None]] = []  # per open container: [b"{" or b"[", current key]
    expect_key = False
    after_colon = False
    spans: list[_Span] = []
    pos = 0
    for _ in range(_MAX_TOKENS):
        match = _TOKEN.search(body, pos)
        if match is None:
            break
        token = bytes(match.group())
        pos = match.end()
        value_position = after_colon
        after_colon = False
        if token[0] == 0x22:  # a string
            if expect_key and frames and frames[-1][0] == b"{":
                frames[-1][1] = token
            expect_key = False
        elif token == b":":
            after_colon = True
        elif token == b",":
            expect_key = bool(frames) and frames[-1][0] == b"{"
        elif token in (b"{", b"["):
            if token == b"[" and value_position and _at_input_data(frames):
                span = _span_at(body, match.start())
                if span is not None:
                    spans.append(span)
                    pos = span.end
                    continue
            if not frames and token != b"{":
                return None
            frames.append([token, None])
            expect_key = token == b"{"
        else:  # } or ]
            if not frames:
                return None
            frames.pop()
            if not frames:
                break
    else:
        return None  # too many tokens: a document of many strings or small values
    if not spans:
        return None
    nonce = secrets.token_hex(8)
    pieces: list[bytes] = []
    placed: dict[str, _Span] = {}
    last = 0
    for i, span in enumerate(spans):
        placeholder = f"\x00{nonce}:{i}"
        placed[placeholder] = span
        pieces += (bytes(body[last : span.start]), json.dumps(placeholder).encode())
        last = span.end
    pieces.append(bytes(body[last:]))
    return b"".join(pieces), SplicedData(body, placed)


def _at_input_data(frames: list[list[bytes | None]]) -> bool:
    """Whether the value being read is `inputs[i].data` of the top-level object."""
    return (
        len(frames) == 3
        and frames[0] == [b"{", b'"inputs"']
        and frames[1][0] == b"["
        and frames[2] == [b"{", b'"data"']
    )


def _span_at(body: memoryview, start: int) -> _Span | None:
    """The rectangular array of numbers starting at `start`, or None (anything else: the
    document's parse decides)."""
    run_end = _match_end(_RUN, body, start)
    arrays = [0]
    found = _array_at(body, start, run_end, arrays, 1)
    if found is None:
        return None
    end, shape = found
    count = 1
    for dim in shape:
        count *= dim
    return _Span(start, end, shape, count)


def _array_at(
    body: memoryview, start: int, run_end: int, arrays: list[int], depth: int
) -> tuple[int, tuple[int, ...]] | None:
    """The end and shape of the array at `start` (a `[`) if it lies within `run_end`, holds
    only numbers or only arrays of one shape, and is not too deep or too many arrays."""
    arrays[0] += 1
    if depth > _MAX_DEPTH or arrays[0] > _MAX_ARRAYS:
        return None
    i = _match_end(_WS, body, start + 1)
    if i >= run_end:
        return None
    first = body[i]
    if first == 0x5D:  # ]
        return i + 1, (0,)
    if first != 0x5B:  # numbers: up to the closing bracket, with no array among them
        found = _CLOSE.search(body, i, run_end)
        if found is None or _OPEN.search(body, i, found.start()) is not None:
            return None
        return found.end(), (_count_commas(body, i, found.start()) + 1,)
    inner: tuple[int, ...] | None = None
    n = 0
    while True:
        child = _array_at(body, i, run_end, arrays, depth + 1)
        if child is None:
            return None
        i, shape = child
        if inner is not None and shape != inner:
            return None  # ragged: numpy's error, from the plain path
        inner = shape
        n += 1
        i = _match_end(_WS, body, i)
        if i >= run_end:
            return None
        if body[i] == 0x5D:
            return i + 1, (n, *inner)
        if body[i] != 0x2C:  # ,
            return None
        i = _match_end(_WS, body, i + 1)
        if i >= run_end or body[i] != 0x5B:
            return None


def _count_commas(body: memoryview, start: int, end: int) -> int:
    """The commas in `body[start:end]`, counted a chunk at a time."""
    return sum(
        bytes(body[pos : min(pos + CHUNK_BYTES, end)]).count(b",")
        for pos in range(start, end, CHUNK_BYTES)
    )


def _match_end(pattern: re.Pattern[bytes], body: memoryview, pos: int) -> int:
    """Where a pattern that matches the empty string stops matching at `pos`."""
    match = pattern.match(body, pos)
    return pos if match is None else match.end()
