"""The connection guard of an HTTP listener: hostile or broken clients cost a bounded amount of
memory, file descriptors and time, and never block the others.

aiohttp bounds the body size (`client_max_size`) and header sizes, but not how many connections
stay open nor how slowly a client may send. `ConnectionGuard` is the protocol factory of the
listening socket and adds both (`agent.api.http.limits.ConnectionLimits`):

* at most `max_connections` connections are open; one more is answered 503 (JSON) and closed;
* a connection whose request line and headers do not arrive within `header_timeout_s` of its
  first byte (slow-loris), or that stays idle `idle_timeout_s` without a request (a fresh
  connection that sends nothing, or keep-alive after a response), is closed;
* a connection whose answers wait in its transport while its peer takes no byte of them for
  `send_timeout_s` is cut (a reader that stalled: its answers would be held forever).

Each connection starts in the app's infer lane, when it has one (`agent.api.http.lane`), and
goes to aiohttp's handler when the lane hands it over; the guard's limits hold for both.

A request "runs" from the moment its handler is entered (headers complete) until it returns,
and a running request is never closed by the guard's clock. The lane tells its connection
itself; on aiohttp's door the app's middleware does, through `running_on` (the connection's
tracker is the protocol of the request's transport), so the guard needs no middleware of its
own put into an app after the app was built. The guard is made with the app
(`create_app` stores it under `CONNECTION_GUARD`) and bound to aiohttp's server by the listener.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

from agent.api.http.lane import InferLane, LaneConnection
from agent.api.http.limits import ConnectionLimits

__all__ = [
    "CONNECTION_GUARD",
    "ConnectionGuard",
    "Tracked",
    "connection_middleware",
    "running_on",
]

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

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


class Tracked(asyncio.Protocol):
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
        self._unsent = 0  # answer bytes waiting in the transport at the last sweep
        self._unsent_since = 0.0  # loop time they last moved

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._since = self._loop.time()
        self._guard.opened()
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
        self._guard.running += 1

    def request_finished(self) -> None:
        self._running -= 1
        if not self._running and self._loop is not None:
            self._since = self._loop.time()
        self._guard.request_finished()

    def close(self) -> None:
        """Close the connection now (its running request, if any, is cancelled)."""
        if self._transport is not None:
            self._transport.close()

    def _stalled(self, now: float, send_timeout_s: float) -> bool:
        """Whether answers wait in the transport for the peer (the connection is not idle then).
        A peer that took no byte of them for `send_timeout_s` is cut: `close` would wait for
        the buffer to drain, and it never would."""
        transport = cast(asyncio.WriteTransport, self._transport)
        unsent = transport.get_write_buffer_size()
        if not unsent:
            self._unsent = 0
            return False
        if unsent != self._unsent:  # it moved (or a new answer came): the clock starts again
            self._unsent, self._unsent_since = unsent, now
        elif now - self._unsent_since >= send_timeout_s:
            logger.debug("aborting a connection: its peer took no byte for %.0f s", send_timeout_s)
            transport.abort()
            self._transport = None
        return True

    def expire_if_due(self, now: float, limits: ConnectionLimits, tick_s: float) -> None:
        """Close the connection when its headers or its idle time are over their limit; a body
        the lane has waited a tick for goes to aiohttp, which times it (`body_timeout_s`)."""
        if self._transport is None:
            return
        if self._stalled(now, limits.send_timeout_s):
            return
        if self._running:
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
        self._open: set[Tracked] = set()
        self.refused = 0
        self.running = 0  # requests running on all its connections (lanes' and aiohttp's)
        self._idle: asyncio.Future[None] | None = None  # set while `wait_idle` waits
        self._sweeper: asyncio.TimerHandle | None = None
        # Timeouts are honoured within a quarter of the shorter one (at most 1 s late).
        shortest = min(limits.header_timeout_s, limits.idle_timeout_s, limits.send_timeout_s)
        self._tick_s = min(1.0, max(0.01, shortest / 4))

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
        tracked = Tracked(self, self.lane)
        # Counted at once, not at connection_made: a burst of accepts cannot overshoot.
        self._open.add(tracked)
        return tracked

    def opened(self) -> None:
        """`connection_made` (already counted when created): the sweep runs while any is open."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self._tick_s, self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for tracked in list(self._open):
            tracked.expire_if_due(now, self.limits, self._tick_s)
        self._sweeper = loop.call_later(self._tick_s, self._sweep) if self._open else None

    def closed(self, tracked: Tracked) -> None:
        self._open.discard(tracked)

    def request_finished(self) -> None:
        self.running -= 1
        if not self.running and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def stop_lanes(self) -> None:
        """The agent is stopping (the policy's stop begun, no new connections): idle lane
        connections close, bodies still arriving are refused, other bytes the lanes hold go to
        aiohttp, and a running request's answer closes its connection."""
        for tracked in list(self._open):
            lane = tracked.lane
            if lane is not None and not lane.done:
                lane.stop()

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait until no request runs on any of the guard's connections, at most `timeout_s`;
        returns how many still run."""
        if self.running:
            self._idle = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait({self._idle}, timeout=max(timeout_s, 0.0))
            finally:
                self._idle = None
        return self.running

    def close_all(self) -> None:
        """Close every connection still open (past the drain: what runs is cancelled)."""
        for tracked in list(self._open):
            tracked.close()


# The app's guard, made with the app; its listener binds it to aiohttp's server.
CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)


def running_on(request: web.Request) -> Tracked | None:
    """The guard's tracker of the connection a request came on (None: not behind a guard, or
    gone): the request's transport's protocol, the tracker aiohttp's handler sits behind."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Tracked) else None


@web.middleware
async def connection_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks each request as running on its connection, for an app with no other middleware
    (the metrics app; the KServe app's one middleware does it itself: one coroutine per
    request)."""
    tracked = running_on(request)
    if tracked is None:
        return await handler(request)
    tracked.request_started()
    try:
        return await handler(request)
    finally:
        tracked.request_finished()
