"""A running loop gRPC engine with probe methods, for the HTTP/2 conformance tests.

The engine is the real `LoopGrpcServer` on its own event loop (a thread), on 127.0.0.1 and a
free port; only the method table is the tests' own, so each case can hold a stream in the state
it needs:
    Echo      unary: answers its request's bytes
    Hold      unary: never answers (the stream stays open, or half-closed once the client ends)
    Metadata  unary: answers the call's metadata as JSON (what the header block decoded to)
    Stream    streaming: answers each message as it comes
Hold records each call it saw cancelled, by its `x-probe` metadata.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from agent.api.grpc.loop.server import CallContext, LoopGrpcServer, Method
from agent.api.http.limits import ConnectionLimits
from tests import h2_client as h
from tests.h2_client import H2Client

ECHO = "/probe.Probe/Echo"
HOLD = "/probe.Probe/Hold"
METADATA = "/probe.Probe/Metadata"
STREAM = "/probe.Probe/Stream"
MAX_MESSAGE = 32 << 20


class Probe:
    """The server's port, and what its Hold method saw."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._cancelled: dict[str, threading.Event] = {}

    def cancelled(self, probe: str) -> threading.Event:
        """Set once the Hold call with `x-probe: probe` is cancelled."""
        with self._lock:
            return self._cancelled.setdefault(probe, threading.Event())


def _methods(probe: list[Probe]) -> dict[str, Method]:
    async def echo(request: bytes, context: CallContext) -> bytes:
        return request

    async def hold(request: bytes, context: CallContext) -> bytes:
        try:
            await asyncio.Event().wait()
        finally:
            tag = dict(context.invocation_metadata()).get("x-probe")
            if tag is not None:
                probe[0].cancelled(tag).set()
        return b""

    async def metadata(request: bytes, context: CallContext) -> bytes:
        return json.dumps(context.invocation_metadata()).encode()

    async def stream(requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    return {
        ECHO: Method(echo, None, streaming=False),
        HOLD: Method(hold, None, streaming=False),
        METADATA: Method(metadata, None, streaming=False),
        STREAM: Method(stream, None, streaming=True),
    }


@contextmanager
def probe_server() -> Iterator[Probe]:
    """The loop engine serving the probe methods; stopped (its connections cut) on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    holder: list[Probe] = []
    server = LoopGrpcServer(
        _methods(holder), max_message_bytes=MAX_MESSAGE, limits=ConnectionLimits()
    )
    try:
        start = server.start("127.0.0.1", 0, None)
        port = asyncio.run_coroutine_threadsafe(start, loop).result(30)
        holder.append(Probe(port))
        yield holder[0]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# Calls in the shape the cases need ------------------------------------------------------------


def call(conn: H2Client, sid: int, path: str = ECHO, body: bytes = b"hello") -> bytes:
    """A whole unary call's frames: HEADERS, one message in DATA, END_STREAM."""
    return conn.headers(sid, h.request_fields(path)) + h.frame(
        h.DATA, h.END_STREAM, sid, h.grpc_message(body)
    )


def opened(conn: H2Client, sid: int, path: str = HOLD, **extra: str) -> bytes:
    """HEADERS that open a call and leave it open (no END_STREAM)."""
    return conn.headers(sid, h.request_fields(path, **extra))


def half_closed(conn: H2Client, sid: int) -> bytes:
    """A Hold call the client ended: the stream stays half-closed (remote)."""
    return call(conn, sid, HOLD)


def answered(conn: H2Client, sid: int, body: bytes = b"hello") -> None:
    """The call on `sid` was served: an OK status and the echo of `body`."""
    headers, data, trailers = conn.response(sid)
    assert headers[":status"] == "200"
    assert trailers["grpc-status"] == "0", trailers
    assert data == h.grpc_message(body)
