"""Connection and body limits of the HTTP listeners: hostile or broken clients cost a bounded
amount of memory, file descriptors and time, and never block the others.

aiohttp bounds the body size (`client_max_size`) and header sizes, but not how many connections
stay open nor how slowly a client may send. `ConnectionGuard` is the protocol factory of the
listening socket and adds both:

* at most `max_connections` connections are open; one more is answered 503 (JSON) and closed;
* a connection whose request line and headers do not arrive within `header_timeout_s` of its
  first byte (slow-loris), or that stays idle `idle_timeout_s` without a request (a fresh
  connection that sends nothing, or keep-alive after a response), is closed.

Each connection starts in the app's infer lane, when it has one (`agent.api.http.lane`), and
goes to aiohttp's handler when the lane hands it over; the guard's limits hold for both.

A request "runs" from the moment its handler is entered (headers complete) until it returns:
`guard_middleware` tells the guard (the lane tells it itself). `read_body_up_front` then bounds
the body: a declared Content-Length over the limit is refused (413) before a byte of it is read,
and a body that does not arrive within `body_timeout_s` gets 408; both close the connection,
since the rest of the body is never read.

When the agent stops, aiohttp drops whatever a connection sends after that moment, so a request
whose body had not all arrived can never complete: `STOPPING` is set as the stop begins, and such
a request is answered 503 at once instead of holding the stop until its body timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.api.http.lane import InferLane, LaneConnection
from agent.errors import AgentError, InvalidInputError, OverloadedError, PayloadTooLargeError

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ClientTimeoutError(AgentError):
    """The client sent its request body too slowly (HTTP 408)."""


class StoppingError(OverloadedError):
    """The agent began to stop while a request's body was still arriving (HTTP 503)."""


# Set when the listener starts to stop (see the module doc); absent from apps that read no bodies.
STOPPING = web.AppKey("stopping", asyncio.Event)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections may be open and how long a client may take (`[server]` settings)."""

    max_connections: int = 2048
    header_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    body_timeout_s: float = 60.0


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class _Refused(asyncio.Protocol):
    """A connection over the cap: one 503 answer, then closed."""

    def __init__(self, limit: int) -> None:
        self._body = json.dumps(
            {"error": f"too many open connections (server.max_connections = {limit})"}
        ).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not isinstance: uvloop's transports are not asyncio.Transport subclasses.
        cast(asyncio.Transport, transport).write(_BUSY % (len(self._body), self._body))
        transport.close()


class _Tracked(asyncio.Protocol):
    """A connection behind the guard's clock: aiohttp's request handler, every event passed on;
    or first the infer lane (`agent.api.http.lane`), until it hands the connection to aiohttp.

    Per request it only notes the loop time at a state change (a timer armed and cancelled per
    request cost ~4 µs); the guard's sweep closes the connections past their limit."""

    def __init__(self, guard: ConnectionGuard, lane: InferLane | None) -> None:
        self._guard = guard
        # aiohttp's handler is made when needed: one that never saw a request would close the
        # connection at its keep-alive time, however busy the lane kept it.
        self.inner: asyncio.Protocol | None = None if lane is not None else guard.new_handler()
        self.lane: LaneConnection | None = lane.open_to(self) if lane is not None else None
        self._transport: asyncio.BaseTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._since = 0.0  # loop time of the last change: idle from, or headers awaited from
        self._running = 0  # requests whose handler is running
        self._partial = False  # bytes of a request arrived, its headers are not complete yet
        self._paused = False

    @property
    def key(self) -> object:
        """What the guard files this connection under: aiohttp's handler once there is one."""
        return self.inner if self.inner is not None else self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._since = self._loop.time()
        self._guard.opened(self)
        if self.lane is not None:
            self.lane.attach(transport)
        if self.inner is not None:
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._running and not self._partial:
            self._partial = True
            assert self._loop is not None
            self._since = self._loop.time()
        if self.inner is not None:
            self.inner.data_received(data)
        elif self.lane is not None:
            self.lane.feed(data)

    def hand_over(self, received: bytes) -> None:
        """The lane gives up the connection: aiohttp's handler takes it, from `received` on."""
        assert self.inner is None
        assert self._transport is not None
        inner = self._guard.new_handler()
        self._guard.refile(self, inner)
        self.inner = inner
        inner.connection_made(self._transport)
        if self._paused:
            inner.pause_writing()
        if received:
            inner.data_received(received)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        return None  # as aiohttp: a client that ends its side has gone; its request is cancelled

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._guard.closed(self)
        if self.lane is not None:
            self.lane.connection_lost()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._paused = True
        if self.inner is not None:
            self.inner.pause_writing()
        elif self.lane is not None:
            self.lane.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False
        if self.inner is not None:
            self.inner.resume_writing()
        elif self.lane is not None:
            self.lane.resume_writing()

    def request_started(self) -> None:
        self._running += 1
        self._partial = False

    def request_finished(self) -> None:
        self._running -= 1
        if not self._running and self._loop is not None:
            self._since = self._loop.time()

    def expire_if_due(self, now: float, limits: ConnectionLimits, tick_s: float) -> None:
        """Close the connection when its headers or its idle time are over their limit; a body
        the lane has waited a tick for goes to aiohttp, which times it (`body_timeout_s`)."""
        if self._running or self._transport is None:
            return
        if self.inner is None and self.lane is not None:
            since = self.lane.waiting_body_since()
            if since is not None:
                if now - since >= tick_s:
                    self.lane.give_up()
                return
        limit = limits.header_timeout_s if self._partial else limits.idle_timeout_s
        if now - self._since < limit:
            return
        logger.debug(
            "closing a connection: %s",
            "headers too slow" if self._partial else "idle",
        )
        self._transport.close()
        self._transport = None


class ConnectionGuard:
    """Protocol factory for a listener in front of aiohttp's `web.Server` (see the module doc),
    with the infer lane first on each connection when the app has one."""

    def __init__(self, limits: ConnectionLimits, lane: InferLane | None = None) -> None:
        self.limits = limits
        self.lane = lane
        self._server: web.Server | None = None
        self._open: dict[object, _Tracked] = {}  # aiohttp handler (or the tracker) -> tracker
        self.refused = 0
        self._sweeper: asyncio.TimerHandle | None = None
        # Timeouts are honoured within a quarter of the shorter one (at most 1 s late).
        self._tick_s = min(1.0, max(0.01, min(limits.header_timeout_s, limits.idle_timeout_s) / 4))

    def bind(self, server: web.Server) -> None:
        """Serve through `server` (the `AppRunner`'s, once set up)."""
        self._server = server

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def new_handler(self) -> asyncio.Protocol:
        assert self._server is not None, "bind() the aiohttp server first"
        return self._server()

    def __call__(self) -> asyncio.Protocol:
        assert self._server is not None, "bind() the aiohttp server first"
        if len(self._open) >= self.limits.max_connections:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                logger.warning(
                    "refused %d connection(s): server.max_connections = %d reached",
                    self.refused,
                    self.limits.max_connections,
                )
            return _Refused(self.limits.max_connections)
        tracked = _Tracked(self, self.lane)
        # Counted at once, not at connection_made: a burst of accepts cannot overshoot.
        self._open[tracked.key] = tracked
        return tracked

    def refile(self, tracked: _Tracked, handler: object) -> None:
        """A lane connection now goes through aiohttp's `handler` (which the middleware sees)."""
        if self._open.pop(tracked, None) is not None:
            self._open[handler] = tracked

    def opened(self, tracked: _Tracked) -> None:
        """`connection_made` (already counted when created): the sweep runs while any is open."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self._tick_s, self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for tracked in list(self._open.values()):
            tracked.expire_if_due(now, self.limits, self._tick_s)
        self._sweeper = loop.call_later(self._tick_s, self._sweep) if self._open else None

    def closed(self, tracked: _Tracked) -> None:
        self._open.pop(tracked.key, None)

    async def stop_lanes(self, timeout_s: float) -> None:
        """The agent is stopping (`STOPPING` set, no new connections): idle lane connections
        close, bytes the lanes hold go to aiohttp, and the lanes' running requests get up to
        `timeout_s` to be answered (aiohttp's shutdown, next, would close them unanswered)."""
        running: list[asyncio.Task[None]] = []
        for tracked in list(self._open.values()):
            lane = tracked.lane
            if lane is None or lane.done:
                continue
            lane.stop()
            if lane.task is not None:
                running.append(lane.task)
        if running:
            await asyncio.wait(running, timeout=timeout_s)

    def middleware(self) -> Middleware:
        """Marks each request as running on its connection (so the clock does not close it)."""

        @web.middleware
        async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            tracked = self._open.get(request.protocol)
            if tracked is None:
                return await handler(request)
            tracked.request_started()
            try:
                return await handler(request)
            finally:
                tracked.request_finished()

        return guard_middleware


async def read_body_up_front(request: web.Request, max_bytes: int, body_timeout_s: float) -> None:
    """Read a request's body before its handler runs, within the size limit and the body
    timeout (see module doc); aiohttp keeps it, so the handler's `read()` returns it.

    Raises (to the error middleware):
        PayloadTooLargeError: the declared Content-Length is over `max_bytes` (nothing read).
        ClientTimeoutError: the body did not arrive in time.
        StoppingError: the agent began to stop before the body arrived.
        InvalidInputError: the body cannot be read as sent (see `read_body`).
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLargeError(
            f"request body of {declared} bytes is over the limit of {max_bytes} bytes "
            "(server.max_request_bytes)"
        )
    if request.content.is_eof():  # all arrived with the headers: no timer needed
        await read_body(request)
        return
    started = time.monotonic()
    stopping = request.app.get(STOPPING)
    if stopping is None:
        waiting: set[asyncio.Future[Any]] = set()
    else:
        waiting = {asyncio.ensure_future(stopping.wait())}
    reading = asyncio.ensure_future(read_body(request))
    try:
        await asyncio.wait(
            {reading, *waiting}, timeout=body_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in waiting:
            task.cancel()
        if not reading.done():
            reading.cancel()
    if reading.done() and not reading.cancelled():
        reading.result()  # its error, if any
        return
    if stopping is not None and stopping.is_set():
        raise StoppingError("the server is stopping: the request body did not arrive before")
    raise ClientTimeoutError(
        f"request body not received within {time.monotonic() - started:.1f} s "
        f"(server.body_timeout_ms)"
    )


async def read_body(request: web.Request) -> bytes:
    """The request body; one that cannot be read as sent (a bad gzip or deflate stream, a body
    cut short) is the client's error, not the agent's.

    Raises:
        InvalidInputError: aiohttp could not read or decode the body.
    """
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        reason = " ".join(str(exc).split()).removeprefix("400, message: ")
        raise InvalidInputError(f"could not read the request body: {reason}") from None


def must_close(error: BaseException) -> bool:
    """Whether an answer to this error must close the connection: the body was not read whole."""
    return isinstance(error, PayloadTooLargeError | ClientTimeoutError | StoppingError)
