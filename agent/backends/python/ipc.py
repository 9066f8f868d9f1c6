"""The wire between the agent and a Python model's worker process.

One message is one frame on the socketpair::

    prefix  12 bytes: header length (u32 LE), data length (u64 LE)
    header  {"kind": "execute", "meta": {...}, "tensors": [{"name", "datatype", "shape",
             "nbytes"}, ...]} as JSON, padded with spaces to a multiple of 16 bytes
    data    each tensor's bytes at the next multiple of 16: row-major little-endian; BYTES
            tensors in KServe's encoding (4-byte little-endian length before each element)

Tensor data never goes through JSON. New per-request or per-response fields (parameters, ids)
go in `meta`: EXECUTE's `meta["requests"][i]`, RESULT's `meta["responses"][i]`.

Cost per message: the sender writes the whole frame with one write(2) (small frames are joined;
large ones go out with writev(2) from the arrays' own memory); the receiver reads the prefix,
then the rest into one buffer, whose writable views are the tensors (no copy per tensor). A
reader never reads past its frame, so polling the descriptor still says whether another message
waits. Descriptors may be non-blocking (the agent's ends are: a read that finds data needs no
poll first); `send` then waits for room itself.

Why a socketpair and not shared memory: a worker can be killed at any moment (hang timeout,
crash, `kill -9` of the agent). A socketpair disappears with its last holder, while a
shared-memory segment in /dev/shm outlives a process killed before it unlinks it. The price is
one copy per tensor each way, small next to the cost of Python pre/post-processing.

Flow control: a socket buffer holds far less than one large tensor, so a writer blocks until the
other side reads. The worker reads its end at all times (its main thread while it waits for
work, a relief thread while user code runs long or waits for a reply: `python_mailbox`), so a
write from the agent never waits on user code for long, and both sides can never be stuck
writing at once (an abandoned BLS result of many MB while the worker sends its own answer,
say).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agent.pb_utils import numpy_to_kserve
from agent.tensors import datatypes
from agent.tensors.request import tensor_from_bytes, tensor_to_bytes

# Message kinds.
INIT = "init"  # agent → worker: meta {"model_file", "args"}
READY = "ready"  # worker → agent, after initialize
EXECUTE = "execute"  # agent → worker: meta {"outputs": [...]}, tensors: the inputs
RESULT = "result"  # worker → agent, tensors: the outputs
ERROR = "error"  # worker → agent: meta {"message"}
FINALIZE = "finalize"  # agent → worker
FINALIZED = "finalized"  # worker → agent, then it exits
AUTOCOMPLETE = "autocomplete"  # agent → worker: meta {"model_file", "config", "model_name"}
COMPLETED = "completed"  # worker → agent: meta {"config"}: the completed config as JSON
LOG = "log"  # worker → agent at any time: meta {"level", "message", "file", "line"}
# worker → agent before any other message it sends, when custom metrics changed:
# meta {"families": [...], "metrics": [...]} (see agent.pb_utils.metrics.take_updates)
METRICS = "metrics"
# BLS (agent.backends.python.bls): worker → agent inside `execute`, meta {"id", "model",
# "version", "outputs", "timeout_us", "parameters", "request_id"}, tensors: the inputs; the agent
# answers each with BLS_RESULT, meta {"id"} and the outputs, or {"id", "error"}.
BLS = "bls"
BLS_RESULT = "bls_result"
# A BLS_RESULT error for a call whose request was cancelled (Triton's message; both sides use it).
CANCELLED = "Request was cancelled"
# worker → agent: meta {"id"}: the model dropped that BLS call (its asyncio task was cancelled);
# the agent cancels the child request and sends no result.
BLS_CANCEL = "bls_cancel"
# agent → worker inside `execute`: meta {"requests": [index, ...]}: those requests of the batch
# were cancelled (the client went away, or the BLS call that made them was cancelled);
# `InferenceRequest.is_cancelled()` then answers True. For a decoupled model, meta {"id"}: that
# request (see RESPONSE), at any time until its final flag.
CANCEL = "cancel"
# worker → agent: meta {"id", "family", "labels"}: the agent's total of one custom metric (every
# instance's share); the agent answers METRIC_VALUE_RESULT meta {"id", "value"} (None: unknown).
METRIC_VALUE = "metric_value"
METRIC_VALUE_RESULT = "metric_value_result"
# Decoupled models (agent.backends.python.stream): EXECUTE's requests carry an "id" each; the
# worker sends RESPONSE meta {"id", "final", "error"?}, tensors: the outputs, at any time (from
# any thread, during or after `execute`), and RESULT meta {"responses": []} when `execute`
# returned.
RESPONSE = "response"
# Liveness (agent.backends.python.supervisor): agent → worker PING meta {"n"} at any time after
# READY; whoever reads the worker's pipe hands it to a thread of its own that answers PONG
# meta {"n"} (a reader never writes: see the flow control above). A PONG may come late, after
# the `execute` it overlapped: the numbers say which PING it answers.
PING = "ping"
PONG = "pong"

MAX_HEADER_BYTES = 1 << 20
# A frame: this prefix (header length, data length), the JSON header padded with spaces to a
# multiple of _ALIGN, then the tensors' bytes, each starting at a multiple of _ALIGN.
_PREFIX = struct.Struct("<IQ")
PREFIX_BYTES = _PREFIX.size
_ALIGN = 16
_JOIN_BELOW = 64 * 1024  # smaller frames are joined and written with one write(2)
_COPY_UP_TO = 1024  # tensors up to this size are copied into the frame, larger ones are viewed
_IOV_MAX = 1024  # buffers per writev(2) (Linux's limit)
# json.dumps with any option builds a new encoder per call, and JSONEncoder.encode builds its C
# encoder per call: this one is made once (stateless without circular checks: headers are
# trees); the pure-Python encoder only where the C accelerator is missing.
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"))
_C_HEADER_JSON: Any = None
# Else (an interpreter without the C accelerator, or one whose private signature moved) the
# pure-Python encoder.
with contextlib.suppress(ImportError, TypeError):
    from _json import make_encoder

    # What _HEADER_JSON hands it, without the circular-reference markers.
    _C_HEADER_JSON = make_encoder(
        None,  # markers
        _HEADER_JSON.default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
_HEADER_DECODER = json.JSONDecoder()
_json_string = json.encoder.encode_basestring_ascii  # as the encoder writes a str


@dataclass(frozen=True, slots=True)
class Message:
    """One message: its kind, small JSON-able fields and named tensors."""

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: list[tuple[str, np.ndarray]] = field(default_factory=list)


class WireError(Exception):
    """A malformed message (a bug on one side, not a user error)."""


class HasFileno(Protocol):
    def fileno(self) -> int: ...


def encode(message: Message) -> list[bytes | memoryview]:
    """The buffers of one frame, in order (pure: no copy of large numeric tensors' memory)."""
    described = []
    buffers: list[bytes | memoryview] = []
    data = 0
    for name, array in message.tensors:
        known = datatypes.BY_NUMPY.get(array.dtype)  # a lookup first: every tensor of every call
        kind = known.kserve if known is not None else numpy_to_kserve(array.dtype)
        raw: bytes | memoryview
        if kind == "BYTES":
            raw = tensor_to_bytes(array, kind)
            nbytes = len(raw)
        else:
            nbytes = array.nbytes
            if nbytes <= _COPY_UP_TO:  # cheaper than a view, which a small frame copies anyway
                raw = array.tobytes()
            else:  # the array's own memory goes to the socket: no intermediate copy
                raw = np.ascontiguousarray(array).reshape(-1).data.cast("B")
        # Written out, not a dict for the encoder: the description is a fixed shape (its
        # name escaped as the encoder would; a shape is a list of ints, which repr writes).
        described.append(
            f'{{"name":{_json_string(name)},"datatype":"{kind}",'
            f'"shape":{list(array.shape)},"nbytes":{nbytes}}}'
        )
        pad = -data % _ALIGN
        if pad:
            buffers.append(bytes(pad))
        buffers.append(raw)
        data += pad + nbytes
    if _C_HEADER_JSON is None:
        meta = _HEADER_JSON.encode(message.meta)
    else:
        meta = "".join(_C_HEADER_JSON(message.meta, 0))
    header = (
        f'{{"kind":{_json_string(message.kind)},"meta":{meta},"tensors":[{",".join(described)}]}}'
    ).encode()
    header += b" " * (-len(header) % _ALIGN)
    if len(header) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    return [_PREFIX.pack(len(header), data) + header, *buffers]


def frame_lengths(prefix: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(header bytes, data bytes) of a frame from its prefix.

    Raises:
        WireError: the header is larger than MAX_HEADER_BYTES.
    """
    header, data = _PREFIX.unpack(prefix)
    if header > MAX_HEADER_BYTES:
        raise WireError(f"header of {header} bytes exceeds {MAX_HEADER_BYTES}")
    return header, data


def decode(body: bytearray, header_bytes: int) -> Message:
    """The message in a frame's body (header, then data); its tensors are writable views of
    `body` (pure).

    Raises:
        WireError: the message is malformed.
    """
    header = _parse_header(memoryview(body)[:header_bytes])
    tensors = []
    offset = header_bytes
    for item in header["tensors"]:
        name, kind, shape, nbytes = _describe(item)
        offset += -(offset - header_bytes) % _ALIGN
        if offset + nbytes > len(body):
            raise WireError(f"tensor '{name}': {nbytes} bytes overrun the message")
        array: np.ndarray
        if kind == "BYTES":
            array = tensor_from_bytes(memoryview(body)[offset : offset + nbytes], kind, shape)
        else:
            dtype = datatypes.BY_KSERVE[kind].numpy
            if nbytes != math.prod(shape) * dtype.itemsize:
                raise WireError(f"tensor '{name}': {nbytes} bytes do not fill shape {shape}")
            if nbytes == 0:
                array = np.empty(shape, dtype=dtype)
            else:
                array = np.ndarray(shape, dtype, body, offset)  # a view of `body`
        tensors.append((name, array))
        offset += nbytes
    return Message(header["kind"], header["meta"], tensors)


def send(conn: HasFileno, message: Message) -> None:
    """Send a message (blocking, also on a non-blocking descriptor: it waits for room).

    Raises:
        OSError: the other side is gone.
    """
    send_frame(conn, encode(message))


def frame_size(buffers: Sequence[bytes | memoryview]) -> int:
    """The bytes of an encoded frame."""
    size = 0
    for buffer in buffers:  # a loop, not sum(<generator>): twice per message on the loop
        size += buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
    return size


def send_frame(conn: HasFileno, buffers: Sequence[bytes | memoryview]) -> None:
    """Send an encoded frame (`encode`), as `send`."""
    fd = conn.fileno()
    if frame_size(buffers) < _JOIN_BELOW:  # one small copy is cheaper than scattered writes
        data = b"".join(buffers)
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            written = 0
        if written == len(data):
            return  # the usual case: the whole frame at once
        buffers = [memoryview(data)[written:]]
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        try:
            written = os.writev(fd, views[:_IOV_MAX])
        except BlockingIOError:
            _wait(fd, select.POLLOUT, None)
            continue
        while written:
            if written >= views[0].nbytes:
                written -= views.pop(0).nbytes
            else:
                views[0] = views[0][written:]
                written = 0


def receive(conn: HasFileno, deadline: float | None = None) -> Message:
    """Receive one message; `deadline` is a `time.monotonic()` instant, None waits for ever.

    Reads exactly one frame, never beyond it, so polling the descriptor still tells whether
    another message waits.

    Raises:
        TimeoutError: the deadline passed before the whole message arrived.
        EOFError: the other side closed the connection (or died).
        WireError: the message is malformed.
    """
    return receive_body(conn, read_prefix(conn, deadline), deadline)


def read_prefix(conn: HasFileno, deadline: float | None = None) -> tuple[int, int]:
    """Read a frame's prefix: (header bytes, data bytes) that follow. Raises as `receive`."""
    prefix = bytearray(PREFIX_BYTES)
    _read_into(conn.fileno(), memoryview(prefix), deadline)
    return frame_lengths(prefix)


def receive_body(
    conn: HasFileno, lengths: tuple[int, int], deadline: float | None = None
) -> Message:
    """Read the rest of a frame whose prefix `read_prefix` read. Raises as `receive`."""
    header, data = lengths
    body = bytearray(header + data)
    _read_into(conn.fileno(), memoryview(body), deadline)
    return decode(body, header)


class FrameReader:
    """Reads messages off a blocking descriptor with read-ahead, for a descriptor read by
    nobody else (the worker's end): a small message, and what follows it, come in one read(2)
    instead of two. Not for the agent's ends: a poll of the descriptor no longer says whether a
    message waits (it may wait in this buffer). Messages larger than the buffer are read into
    their own memory, exactly to their end. One thread at a time may call `receive`.
    """

    _SIZE = 64 * 1024

    def __init__(self, conn: HasFileno) -> None:
        # The descriptor is asked for at each read: a closed connection then raises instead of
        # reading whatever the number means by now.
        self._conn = conn
        self._buffer = bytearray(self._SIZE)
        self._view = memoryview(self._buffer)
        self._start = 0  # the unread bytes are _buffer[_start:_end]
        self._end = 0

    def receive(self) -> Message:
        """The next message (blocking). Raises as `receive`."""
        if self._end - self._start < PREFIX_BYTES:
            self._fill()
        header, data = _PREFIX.unpack_from(self._buffer, self._start)
        if header > MAX_HEADER_BYTES:
            raise WireError(f"header of {header} bytes exceeds {MAX_HEADER_BYTES}")
        start = self._start + PREFIX_BYTES
        end = start + header + data
        if end <= self._end:  # the whole message is here: its own copy (tensors are views)
            body = bytearray(self._view[start:end])
            self._start = end
        else:
            body = bytearray(header + data)
            got = self._end - start
            body[:got] = self._view[start : self._end]
            self._start = self._end = 0
            _read_into(self._conn.fileno(), memoryview(body)[got:], None)
        return decode(body, header)

    def _fill(self) -> None:
        """Read until a prefix is buffered (the unread bytes moved to the front first)."""
        waiting = self._end - self._start
        if waiting:  # a few bytes: copied out first (the two ranges may overlap)
            self._buffer[:waiting] = bytes(self._view[self._start : self._end])
        self._start, self._end = 0, waiting
        fd = self._conn.fileno()
        while self._end < PREFIX_BYTES:
            # Asleep in poll(2), not in read(2): a reader asleep in read(2) is also woken each
            # time the other side reads what this end wrote (the socket's room-to-write
            # wake-up, which poll(2) filters out), a wasted switch here that the other side
            # pays for in its read.
            _wait(fd, select.POLLIN, None)
            try:
                count = os.readv(fd, [self._view[self._end :]])
            except BlockingIOError:
                continue
            if count == 0:
                raise EOFError("the other side closed the connection")
            self._end += count


def receive_waiting(conn: HasFileno) -> Message | Callable[[float | None], Message] | None:
    """Read one message off a non-blocking descriptor without waiting: the message when its
    whole frame was there; None when nothing waited; when only the frame's start had arrived,
    a function that reads the rest, up to a `time.monotonic()` deadline (None: no limit), and
    returns the message, for a thread to call. Two reads at most, never beyond the frame.

    Raises:
        EOFError: the other side closed the connection.
        WireError: the message is malformed.
        OSError: the descriptor failed.
    """
    fd = conn.fileno()
    prefix = bytearray(PREFIX_BYTES)
    try:
        got = os.readv(fd, [prefix])
    except BlockingIOError:
        return None  # woken for nothing
    if got == 0:
        raise EOFError("the other side closed the connection")
    if got < PREFIX_BYTES:
        return lambda deadline: _rest_of_frame(conn, prefix, got, deadline)
    header, data = frame_lengths(prefix)
    body = bytearray(header + data)
    try:
        got = os.readv(fd, [body])
    except BlockingIOError:
        got = 0
    if got < len(body):  # still streaming in (or cut short: the rest raises EOFError)
        return lambda deadline: _rest_of_body(conn, body, header, got, deadline)
    return decode(body, header)


def _rest_of_frame(conn: HasFileno, prefix: bytearray, got: int, deadline: float | None) -> Message:
    _read_into(conn.fileno(), memoryview(prefix)[got:], deadline)
    return receive_body(conn, frame_lengths(prefix), deadline)


def _rest_of_body(
    conn: HasFileno, body: bytearray, header: int, got: int, deadline: float | None
) -> Message:
    _read_into(conn.fileno(), memoryview(body)[got:], deadline)
    return decode(body, header)


def _read_into(fd: int, view: memoryview, deadline: float | None) -> None:
    nonblocking = deadline is not None and not os.get_blocking(fd)
    got = 0
    size = view.nbytes
    while got < size:
        if deadline is not None and not nonblocking:
            _wait(fd, select.POLLIN, deadline)  # a blocking read could outlast the deadline
        try:
            count = os.readv(fd, [view[got:]])
        except BlockingIOError:
            _wait(fd, select.POLLIN, deadline)
            continue
        if count == 0:
            raise EOFError("the other side closed the connection")
        got += count


def _wait(fd: int, events: int, deadline: float | None) -> None:
    poller = select.poll()  # not select(): a busy agent's descriptors pass 1024
    poller.register(fd, events)
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        if poller.poll(timeout):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("no message before the deadline")


def _parse_header(raw: memoryview) -> dict[str, Any]:
    try:  # the decoder itself, not json.loads: no encoding sniffing (the header is ASCII)
        text = str(raw, "utf-8")
        header, end = _HEADER_DECODER.raw_decode(text)
    except ValueError as exc:  # UnicodeDecodeError included
        raise WireError(f"header is not JSON: {exc}") from None
    if end < len(text) and not text[end:].isspace():  # only the padding may follow
        raise WireError(f"header has data after its JSON at {end}")
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("kind"), str)
        or not isinstance(header.get("meta"), dict)
        or not isinstance(header.get("tensors"), list)
    ):
        raise WireError("header needs kind, meta and tensors")
    return header


def _describe(item: Any) -> tuple[str, str, Sequence[int], int]:
    if not isinstance(item, dict):
        raise WireError("tensor description is not an object")
    name, kind, shape, nbytes = (
        item.get("name"),
        item.get("datatype"),
        item.get("shape"),
        item.get("nbytes"),
    )
    if (
        type(name) is not str
        or kind not in datatypes.BY_KSERVE
        or type(shape) is not list
        or type(nbytes) is not int
        or nbytes < 0
    ):
        raise WireError(f"bad tensor description {item!r}")
    for size in shape:  # a loop, not all(<generator>): this runs for every tensor
        if type(size) is not int or size < 0:
            raise WireError(f"bad tensor description {item!r}")
    return name, kind, shape, nbytes
