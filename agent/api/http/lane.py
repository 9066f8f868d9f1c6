"""The infer lane: KServe v2 `/infer` requests served straight from the HTTP connection.

aiohttp's per-request machinery (its parser objects, request and response objects, the router,
the middleware chain, a task hand-off per request) costs more CPU than the rest of a small
inference. The lane reads the commonest request shape itself: `POST /v2/models/M[/versions/V]/infer`
over HTTP/1.1, with a `Content-Length` body and nothing unusual in its head, and answers it with
the same handler (`agent.api.http.infer`), the same policy (`agent.api.http.policy`) and the
same error table (`agent.api.http.errors`) as aiohttp's door, so a client reads the same status
and bytes from either.

The lane skips work, never rules: for each request it asks the app's `HttpPolicy` what aiohttp's
middleware asks (restricted API groups, the declared body length, memory in flight, the stop). A
refusal that keeps the connection (a restricted group: 403) it answers itself once the body is
in; one whose body will never be read (413, no memory in flight for it or a body still arriving
at the stop: 503) it hands to aiohttp's
door, which answers it from the same policy and error table and lingers, reading the rest, so
the client sees the answer before the close.

Anything else is handed over too, at a request boundary and with every byte already received,
to aiohttp's own protocol for the rest of the connection's life: other routes, chunked or
encoded bodies, `Expect`, upgrades, HTTP/1.0, a percent-encoded path, a body that arrives slowly
(aiohttp times it), buffered requests when the agent stops. The lane's head parser only ever
accepts; when in doubt it hands over.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from types import MappingProxyType
from typing import Protocol, cast

from aiohttp import web

from agent.api.http.codec import HEADER_LENGTH
from agent.api.http.errors import error_answer, error_body
from agent.api.http.infer import answer_infer
from agent.api.http.limits import must_close
from agent.api.http.policy import HttpPolicy
from agent.errors import AgentError, MemoryPressureError
from agent.models.inflight import Hold
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits
from agent.tracing.tracer import PROPAGATED

logger = logging.getLogger(__name__)

# A head longer than this is aiohttp's to judge (its own line and field limits are 8190 bytes).
HEAD_MAX = 8190

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_FIELD = _TOKEN + rb":[\t\x20-\x7e\x80-\xff]*"
# The request line and the syntax of every header line, checked in one match (in C): the loop
# below then only reads the few headers the lane needs.
_HEAD = re.compile(
    rb"POST /v2/models/([A-Za-z0-9_.\-]+)(?:/versions/([0-9]+))?/infer HTTP/1\.1"
    rb"((?:\r\n" + _FIELD + rb")*)"
)
_DIGITS = re.compile(rb"[0-9]{1,18}")
# Headers whose presence means the request is not the lane's shape (aiohttp handles them).
_HAND_OVER = frozenset(
    {b"transfer-encoding", b"content-encoding", b"expect", b"upgrade", b"trailer", b"te"}
)
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
_TRACE_HEADERS = frozenset(name.encode() for name in PROPAGATED)


# The lane's two routes, as the app's router names them (the policy judges requests by route).
INFER_ROUTE = "/v2/models/{model}/infer"
VERSION_INFER_ROUTE = "/v2/models/{model}/versions/{version}/infer"


@dataclass(slots=True)
class InferHead:
    """The parts of an infer request's head the lane uses (one object per distinct head bytes,
    shared by the requests that repeat them: see `cached_infer_head`)."""

    model: str
    version: str | None
    content_length: int
    header_length: int | None  # Inference-Header-Content-Length
    keep_alive: bool
    trace_headers: Mapping[str, str]  # traceparent / tracestate, when sent
    fields: bytes = field(repr=False)  # the header lines as received, each after its "\r\n"
    _headers: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def route(self) -> str:
        return INFER_ROUTE if self.version is None else VERSION_INFER_ROUTE

    @property
    def headers(self) -> Mapping[str, str]:
        """Every header by its lower-case name (the first of repeated ones, as aiohttp's
        `headers.get`), read as aiohttp reads them; parsed on first use only."""
        if self._headers is None:
            self._headers = _header_map(self.fields)
        return self._headers

    def get(self, name: str, /) -> str | None:
        """A header's value by its lower-case name (`agent.api.access.Headers`): the policy
        reads the head's headers only when it has restricted groups to check."""
        return self.headers.get(name)


def _header_map(fields: bytes) -> Mapping[str, str]:
    headers: dict[str, str] = {}
    for line in fields.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers.setdefault(
            name.lower().decode("ascii"), value.strip(b" \t").decode("utf-8", "surrogateescape")
        )
    return MappingProxyType(headers)


def parse_infer_head(head: bytes) -> InferHead | None:
    """The head of an infer request in the lane's shape, or None for anything else (aiohttp's).

    `head` runs from the request line to the blank line that ends it, exclusive.
    """
    match = _HEAD.fullmatch(head)
    if match is None:
        return None  # also obsolete line folding (a line starting with whitespace)
    model, version, fields = match.groups()
    content_length: int | None = None
    header_length: int | None = None
    keep_alive = True
    hosts = 0  # HTTP/1.1 needs exactly one (aiohttp refuses the request otherwise)
    trace: dict[str, str] = {}
    for line in fields.split(b"\r\n")[1:]:
        name, _, raw_value = line.partition(b":")
        value = raw_value.strip(b" \t")
        key = name.lower()
        if key in _HAND_OVER:
            return None
        if key == b"content-length":
            if content_length is not None or _DIGITS.fullmatch(value) is None:
                return None
            content_length = int(value)
        elif key == _HEADER_LENGTH:
            if header_length is not None or _DIGITS.fullmatch(value) is None:
                return None
            header_length = int(value)
        elif key == b"host":
            hosts += 1
        elif key == b"connection":
            options = {option.strip(b" \t") for option in value.lower().split(b",")}
            if not options <= {b"keep-alive", b"close"}:
                return None
            keep_alive = b"close" not in options
        elif key in _TRACE_HEADERS:
            if key.decode() in trace:
                return None
            trace[key.decode()] = value.decode("latin-1")
    if content_length is None or hosts != 1:
        return None
    return InferHead(
        model=model.decode(),
        version=None if version is None else version.decode(),
        content_length=content_length,
        header_length=header_length,
        keep_alive=keep_alive,
        trace_headers=MappingProxyType(trace),  # a head is shared by the requests that repeat it
        fields=fields,
    )


_heads: dict[bytes, InferHead | None] = {}
_HEADS_KEPT = 64  # distinct heads remembered; a client sends one per tensor shape


def cached_infer_head(head: bytes) -> InferHead | None:
    """`parse_infer_head`, remembered: tritonclient and perf_analyzer send the same head bytes
    for every request of one shape, so most requests cost a dict lookup. Heads that differ
    every time (a fresh `traceparent` per request) only churn the small cache."""
    try:
        return _heads[head]
    except KeyError:
        parsed = parse_infer_head(head)
    if len(_heads) >= _HEADS_KEPT:
        _heads.clear()
    _heads[head] = parsed
    return parsed


@dataclass(slots=True)
class InferLane:
    """What every lane connection of one listener shares, and what they did."""

    dataplane: DataPlane
    tensor_limits: TensorLimits
    policy: HttpPolicy  # the app's: the same object its middleware asks
    served: int = 0  # requests answered by the lane (refusals included)
    handed_over: int = 0  # connections handed to aiohttp

    def open_to(self, owner: LaneOwner) -> LaneConnection:
        return LaneConnection(self, owner)


# The app's lane: its connection guard puts it first on every connection.
INFER_LANE = web.AppKey("infer_lane", InferLane)


class LaneOwner(Protocol):
    """The connection a lane serves (`agent.api.http.connection`'s tracker)."""

    def request_started(self) -> None: ...

    def request_finished(self) -> None: ...

    def hand_over(self, received: bytes) -> None:
        """Give the connection, with the bytes received and not yet served, to aiohttp."""


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class LaneConnection:
    """One connection's lane: buffers what arrives, serves requests in order (pipelined ones
    wait for the one before), hands over when it meets a request that is not its shape."""

    def __init__(self, lane: InferLane, owner: LaneOwner) -> None:
        self._lane = lane
        self._owner = owner
        self._transport: _Transport | None = None
        self._pieces: list[bytes] = []
        self._size = 0
        self._head: InferHead | None = None
        self._head_size = 0
        self._refusal: AgentError | None = None  # the policy's answer to the head being read
        self._hold: Hold | None = None  # the memory in flight of the request being read or run
        self._body_since: float | None = None  # loop time the lane began to wait for a body
        self._task: asyncio.Task[None] | None = None
        self._paused = False  # the transport's write buffer is full
        self._closing = False  # answer what runs, then close (the agent is stopping)
        self._reading = True  # False: more than a request is buffered behind the one running
        self.done = False  # handed over or closed: the lane reads nothing more

    def attach(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(_Transport, transport)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def waiting_body_since(self) -> float | None:
        """When the lane began to wait for the rest of a body (None: it is not waiting)."""
        return self._body_since if self._task is None else None

    def feed(self, data: bytes) -> None:
        self._pieces.append(data)
        self._size += len(data)
        if self._task is None:
            self._advance()
        elif (
            self._size > self._lane.policy.max_request_bytes + HEAD_MAX
            and self._transport is not None
        ):
            # A client pipelining faster than it is served waits in its socket, not in our memory.
            self._reading = False
            self._transport.pause_reading()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._task is None and not self.done:
            self._advance()

    def connection_lost(self) -> None:
        self.done = True
        self._transport = None
        self._release()
        if self._task is not None:
            self._task.cancel()  # as aiohttp's handler_cancellation: a queued request never runs

    def give_up(self) -> None:
        """Hand the connection over now (a slow body: aiohttp times it); not while busy."""
        if not self.done and self._task is None:
            self._hand_over()

    def stop(self) -> None:
        """The agent is stopping (the policy knows it): an idle connection closes, a running
        request's answer closes its connection, buffered bytes go to aiohttp, whose door
        refuses a body still arriving as the policy says (503)."""
        self._closing = True
        if self.done or self._task is not None:
            return
        if self._size:
            self._hand_over()
        elif self._transport is not None:
            self.done = True
            self._transport.close()

    def _buffered(self) -> bytes:
        if len(self._pieces) > 1:
            self._pieces = [b"".join(self._pieces)]
        return self._pieces[0] if self._pieces else b""

    def _release(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()

    def _hand_over(self) -> None:
        self._release()  # aiohttp's door asks the policy again
        received = self._buffered()
        self._pieces, self._size, self._head, self._body_since = [], 0, None, None
        self._refusal = None
        self.done = True
        self._lane.handed_over += 1
        self._owner.hand_over(received)

    def _advance(self) -> None:
        """Serve the buffered requests in order: start the next complete one, answer the
        policy's refusals on the way (a loop, not recursion: a client may pipeline many)."""
        if not self._reading and self._transport is not None:
            self._reading = True
            self._transport.resume_reading()
        lane = self._lane
        while not (self.done or self._paused or not self._size):
            if self._closing:
                self._hand_over()  # aiohttp answers or drops it as its stop decides
                return
            if self._head is None:
                buffered = self._buffered()
                end = buffered.find(b"\r\n\r\n", 0, HEAD_MAX + 4)
                if end < 0:
                    if self._size > HEAD_MAX:
                        self._hand_over()
                    return
                head = cached_infer_head(buffered[:end])
                if head is None:
                    self._hand_over()
                    return
                refusal = lane.policy.refusal("POST", head.route, head, head.content_length)
                if refusal is not None and must_close(refusal):
                    # The body is never read: aiohttp's door answers (the same policy, the same
                    # error table) and lingers, reading the rest, so the client sees the answer.
                    self._hand_over()
                    return
                if refusal is None:
                    try:
                        self._hold = lane.policy.hold_body(
                            head.content_length, binary=head.header_length is not None
                        )
                    except MemoryPressureError:
                        self._hand_over()  # its body is never read: refused there (503)
                        return
                self._head, self._head_size = head, end + 4
                self._refusal = refusal  # answered once its body is in (the connection goes on)
            head = self._head
            needed = self._head_size + head.content_length
            if self._size < needed:
                if lane.policy.stopping:
                    self._hand_over()  # a body still arriving: refused there (503), lingering
                elif self._body_since is None:
                    self._body_since = asyncio.get_running_loop().time()
                return
            buffered = self._buffered()
            body = memoryview(buffered)[self._head_size : needed]  # no copy: a view of the bytes
            rest = buffered[needed:]
            self._pieces, self._size = ([rest], len(rest)) if rest else ([], 0)
            self._head, self._body_since = None, None
            self._owner.request_started()
            if self._refusal is None:
                self._task = asyncio.get_running_loop().create_task(self._serve(head, body))
                return
            refusal, self._refusal = self._refusal, None
            self._owner.request_finished()
            if not self._answer_error(refusal, not head.keep_alive):
                return

    def _answer_error(self, error: BaseException, close: bool) -> bool:
        """Send the error table's answer to `error`; returns whether the connection goes on."""
        status, message, must = error_answer(self._lane.dataplane, error)
        return self._send(status, error_body(message), None, close or must)

    async def _serve(self, head: InferHead, body: memoryview) -> None:
        lane = self._lane
        received = time.perf_counter_ns()
        close = not head.keep_alive
        try:
            payload, json_length = await answer_infer(
                lane.dataplane,
                lane.tensor_limits,
                (head.model, head.version),
                body,
                head.header_length,
                head.trace_headers,
                received,
            )
            status = 200
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the app's error table; a bug is a 500
            status, message, must = error_answer(lane.dataplane, exc)
            payload, json_length = error_body(message), None
            close = close or must
        finally:
            self._task = None
            self._owner.request_finished()
        sent = self._send(status, payload, json_length, close)
        self._release()  # handed to the socket: HTTP/1.1 reads no more while it waits there
        if sent:
            self._advance()

    def _send(self, status: int, payload: bytes, json_length: int | None, close: bool) -> bool:
        """Write one answer; returns whether the connection goes on (not closed, not closing)."""
        self._lane.served += 1
        close = close or self._closing
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        head_bytes = _response_head(status, len(payload), json_length, close)
        if len(payload) < 16384:
            transport.write(head_bytes + payload)
        else:  # no copy of a large body to join it to its head
            transport.write(head_bytes)
            transport.write(payload)
        if close:
            self.done = True
            transport.close()
            return False
        return True


_JSON_TYPE = b"Content-Type: application/json\r\n"
_ERROR_TYPE = b"Content-Type: application/json; charset=utf-8\r\n"
_BINARY_TYPE = b"Content-Type: application/octet-stream\r\n"
_header_length_name = HEADER_LENGTH.encode()
_date: list[tuple[int, bytes]] = [(0, b"")]


def _http_date() -> bytes:
    """The Date header's value, formatted once a second."""
    now = int(time.time())
    if _date[0][0] != now:
        _date[0] = (now, formatdate(now, usegmt=True).encode())
    return _date[0][1]


_BINARY_OK = (
    b"HTTP/1.1 200 OK\r\n" + _BINARY_TYPE + HEADER_LENGTH.encode() + b": %d\r\n"
    b"Content-Length: %d\r\nDate: %s\r\n%s\r\n"
)
_CLOSE = b"Connection: close\r\n"


def _response_head(status: int, length: int, json_length: int | None, close: bool) -> bytes:
    """The status line and headers of an answer, as aiohttp writes them for the same answer."""
    if status == 200 and json_length is not None:  # binary outputs: the common answer
        return _BINARY_OK % (json_length, length, _http_date(), _CLOSE if close else b"")
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
    if status != 200:
        parts.append(_ERROR_TYPE)
    elif json_length is None:
        parts.append(_JSON_TYPE)
    else:
        parts.append(_BINARY_TYPE)
        parts.append(b"%s: %d\r\n" % (_header_length_name, json_length))
    parts.append(b"Content-Length: %d\r\nDate: %s\r\n" % (length, _http_date()))
    if close:
        parts.append(_CLOSE)
    parts.append(b"\r\n")
    return b"".join(parts)
