"""The "loop" gRPC engine's I/O edge: an `asyncio.Protocol` per connection around `Connection`.

Each call runs a method of the servicer's table (`methods`), with a small context (`peer`,
`invocation_metadata`): unary calls as one task each, started when the request is complete;
streaming calls as one task reading a queue of requests. A method ends its call with its status
by raising `StatusError`; this module knows no method and no servicer. Connection limits are
grpc core's: connections over the cap are closed as accepted, a client that does not finish the
HTTP/2 handshake in time is cut, a connection without calls for the idle timeout gets GOAWAY.
`stop(grace)` sends GOAWAY, lets open calls finish within `grace`, then cancels the rest.

Back-pressure: a connection's unsent answers (the transport's write buffer plus the core's
backlog behind the peer's windows) are held to `sending.UNSENT_CAP`, however large the windows
the peer grants. The transport's buffer over the cap pauses reading (`pause_writing`) until it
is down to a quarter (`resume_writing`); a unary call received whole runs only when the
connection's `SendBudget` admits it, else it waits, unrun; a streaming call produces its next
answer only once the connection is under the cap. A connection backed up whose peer takes no
byte for `limits.send_timeout_s` is closed (`StallClock`). The backlog alone never pauses
reading: the peer's WINDOW_UPDATEs that would drain it come that way.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from google.protobuf.message import DecodeError, Message

from agent.api.grpc.loop import connection as c
from agent.api.grpc.sending import UNSENT_CAP, SendBudget, StallClock
from agent.api.grpc.status import DESERIALIZE_FAILED, Status, StatusError
from agent.api.http.limits import ConnectionLimits

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its handler, its request type and whether it streams.

    `handler(request, context)` returns the response (bytes or a message), or with `streaming`
    takes an async iterator of requests and yields responses. A `request_type` of None: the
    handler takes the request's bytes (it decodes them, or avoids it).
    """

    handler: Callable[..., Any]
    request_type: type[Message] | None
    streaming: bool


class CallContext:
    """What a handler reads of its call (the subset of grpc.aio's ServicerContext it uses)."""

    __slots__ = ("_metadata", "_peer")

    def __init__(self, peer: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self._peer = peer
        self._metadata = metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


class _Call:
    __slots__ = ("admitted", "context", "deadline", "message", "method", "queue", "task")

    def __init__(self, method: Method, context: CallContext) -> None:
        self.method = method
        self.context = context
        self.message: bytes | None = None
        self.task: asyncio.Task[None] | None = None
        self.queue: asyncio.Queue[Message | bytes | None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.admitted = False  # a unary call the send budget let run (it counts there)


class GrpcProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: LoopGrpcServer) -> None:
        self._server = server
        self._core = c.Connection(max_message=server.max_message_bytes)
        self._calls: dict[int, _Call] = {}
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._budget = SendBudget()
        self._stall = StallClock(server.limits.send_timeout_s)
        self._ready: deque[int] = deque()  # unary calls received whole, waiting for the budget
        self._paused = False  # the transport's buffer went over the cap: reading is paused
        self._drained: asyncio.Event | None = None  # streams waiting for the connection to drain
        self._pressure: asyncio.TimerHandle | None = None  # looks while backed up or waiting
        self._written = 0  # bytes handed to the transport
        self._idle_ticks = 0
        self._seen = 0
        self._flush_soon = False
        loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        # Counted from the accept (a burst of accepts is capped before any connection_made);
        # the handshake clock (TLS included) starts there too.
        server.connections.add(self)
        self._timer = loop.call_later(server.limits.header_timeout_s, self._handshake_due)

    # Transport events -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed.done():  # its TLS handshake ended after the server stopped
            transport.close()
            return
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=UNSENT_CAP, low=UNSENT_CAP // 4)
        self._peer = _peer(transport.get_extra_info("peername"))
        self._write()

    def pause_writing(self) -> None:
        """The transport's buffer is over the cap: read nothing more until the peer drains it."""
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()
        self._watch()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self._relieve()

    def data_received(self, data: bytes) -> None:
        core = self._core
        for event in core.receive(data):
            kind = type(event)
            if kind is c.MessageReceived:
                self._message(cast(c.MessageReceived, event))
            elif kind is c.InputEnded:
                self._input_ended(cast(c.InputEnded, event).stream)
            elif kind is c.RequestStarted:
                self._started(cast(c.RequestStarted, event))
            elif kind is c.StreamReset:
                self._drop(cast(c.StreamReset, event).stream)
            elif kind is c.WindowOpened:
                self._relieve()
            elif kind is c.ConnectionEnded:
                self._write()
                self._close()
                return
        self._write()
        if core.closing and not core.streams:
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        for call in self._calls.values():
            if call.task is not None:
                call.task.cancel()  # the client went away: its requests are cancelled
            if call.deadline is not None:
                call.deadline.cancel()
        self._calls.clear()
        self._ready.clear()
        if self._timer is not None:
            self._timer.cancel()
        if self._pressure is not None:
            self._pressure.cancel()
        if self._drained is not None:
            self._drained.set()
        self._server.connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # Calls ------------------------------------------------------------------------------------

    def _started(self, event: c.RequestStarted) -> None:
        sid = event.stream
        method = self._server.methods.get(event.path)
        if method is None:
            self._core.finish(sid, Status.UNIMPLEMENTED, "Method not found!")
            return
        call = _Call(method, CallContext(self._peer, event.metadata))
        self._calls[sid] = call
        if method.streaming:
            call.queue = asyncio.Queue()
            call.task = asyncio.get_running_loop().create_task(self._stream(sid, call))
        if event.timeout_s is not None:
            call.deadline = asyncio.get_running_loop().call_later(
                event.timeout_s, self._deadline, sid
            )

    def _message(self, event: c.MessageReceived) -> None:
        call = self._calls.get(event.stream)
        if call is None:
            return  # refused at its headers
        if call.queue is None:
            if call.message is not None:
                self._end(event.stream, Status.UNIMPLEMENTED, "a unary call takes one request")
                return
            call.message = event.data
            return
        request_type = call.method.request_type
        if request_type is None:
            call.queue.put_nowait(event.data)
            return
        try:
            call.queue.put_nowait(request_type.FromString(event.data))
        except DecodeError:
            self._end(event.stream, Status.INTERNAL, DESERIALIZE_FAILED)

    def _input_ended(self, sid: int) -> None:
        call = self._calls.get(sid)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put_nowait(None)
        elif call.message is None:
            self._end(sid, Status.UNIMPLEMENTED, "a unary call takes one request; none was sent")
        else:
            self._ready.append(sid)
            self._relieve()

    async def _unary(self, sid: int, call: _Call) -> None:
        assert call.message is not None
        data, call.message = call.message, None
        request: Message | bytes = data
        request_type = call.method.request_type
        if request_type is not None:
            try:
                request = request_type.FromString(data)
            except DecodeError:
                self._complete(sid, Status.INTERNAL, DESERIALIZE_FAILED)
                return
        try:
            reply = await call.method.handler(request, call.context)
        except StatusError as exc:
            self._complete(sid, exc.status, exc.message)
            return
        except asyncio.CancelledError:
            self._complete(sid, Status.CANCELLED, "Cancelled")  # a no-op once the call dropped
            raise
        except Exception as exc:  # the servicer maps its errors; anything else is a bug
            logger.exception("gRPC %s failed", getattr(call.method.handler, "__name__", "call"))
            self._complete(sid, Status.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
            return
        if self._reply(sid, reply):
            self._complete(sid, Status.OK)

    async def _stream(self, sid: int, call: _Call) -> None:
        queue = call.queue
        assert queue is not None

        async def requests() -> AsyncIterator[Message | bytes]:
            while (request := await queue.get()) is not None:
                yield request

        responses = call.method.handler(requests(), call.context)
        try:
            async for reply in responses:
                if not self._reply(sid, reply):
                    return
                self._write_soon()
                while sid in self._calls and self._backed_up():
                    self._drained = self._drained or asyncio.Event()
                    self._drained.clear()
                    self._watch()
                    await self._drained.wait()
        except StatusError as exc:
            self._complete(sid, exc.status, exc.message)
            return
        except asyncio.CancelledError:
            self._complete(sid, Status.CANCELLED, "Cancelled")
            raise
        except Exception as exc:
            logger.exception("gRPC stream failed")
            self._complete(sid, Status.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
            return
        finally:
            await responses.aclose()  # its requests are cancelled now, not when collected
        self._complete(sid, Status.OK)

    def _reply(self, sid: int, reply: Message | bytes) -> bool:
        """Send one response; False when it is over the size limit (the call then ends)."""
        payload = reply if type(reply) is bytes else cast(Message, reply).SerializeToString()
        if len(payload) > self._server.max_message_bytes:
            self._complete(
                sid,
                Status.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. "
                f"{self._server.max_message_bytes})",
            )
            return False
        self._budget.answered(len(payload))
        self._core.send_message(sid, payload)
        return True

    def _complete(self, sid: int, status: Status, message: str = "") -> None:
        """The handler's end of a call: trailers, then write."""
        call = self._calls.pop(sid, None)
        if call is None:
            return  # reset or timed out meanwhile
        if call.deadline is not None:
            call.deadline.cancel()
        if call.admitted:
            self._budget.ended()
        self._core.finish(sid, status, message)
        if self._ready:
            self._relieve()  # writes first: the budget counts this answer as unsent
        if self._calls:
            self._write_soon()  # others may finish in this iteration: one send for all
        else:
            self._flush()

    def _end(self, sid: int, status: Status, message: str) -> None:
        """End a call from outside its handler (its task, if any, is cancelled)."""
        call = self._calls.get(sid)
        if call is not None and call.task is not None:
            call.task.cancel()
        self._complete(sid, status, message)

    def _deadline(self, sid: int) -> None:
        self._end(sid, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _drop(self, sid: int) -> None:
        call = self._calls.pop(sid, None)
        if call is not None:
            if call.task is not None:
                call.task.cancel()
            if call.deadline is not None:
                call.deadline.cancel()
            if call.admitted:
                self._budget.ended()
                if self._ready:
                    self._relieve()

    # Back-pressure ----------------------------------------------------------------------------

    def _unsent(self) -> int:
        """Answers' bytes the peer has not taken: the transport's buffer and the core's backlog."""
        buffered = self._transport.get_write_buffer_size() if self._transport is not None else 0
        return buffered + self._core.backlogged

    def _backed_up(self) -> bool:
        return self._paused or self._unsent() > UNSENT_CAP

    def _relieve(self) -> None:
        """The connection may have drained: run the waiting calls the budget admits, wake the
        streams if it is under the cap, keep looking while it is not."""
        ready = self._ready
        if ready:
            self._write()  # what the core holds is in the transport's count
        while ready and not self._paused and self._budget.admit(self._unsent()):
            sid = ready.popleft()
            call = self._calls.get(sid)
            if call is not None:  # else reset or timed out while it waited
                call.admitted = True
                self._budget.started()
                call.task = asyncio.get_running_loop().create_task(self._unary(sid, call))
        backed_up = self._backed_up()
        if self._drained is not None and not backed_up:
            self._drained.set()
        if ready or backed_up:
            self._watch()

    def _watch(self) -> None:
        """Look again soon (the transport says when its buffer drains to a quarter, not to the
        cap; a peer's window may open nothing): the stall clock, then `_relieve`."""
        if self._pressure is None and self._transport is not None:
            interval = min(1.0, self._server.limits.send_timeout_s / 4)
            self._pressure = asyncio.get_running_loop().call_later(interval, self._look)

    def _look(self) -> None:
        self._pressure = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        taken = self._written - transport.get_write_buffer_size()
        now = asyncio.get_running_loop().time()
        if self._stall.stalled(now, taken, self._backed_up()):
            logger.info(
                "gRPC client %s took none of %d unsent bytes for %.0f s: closed",
                self._peer,
                self._unsent(),
                self._stall.timeout_s,
            )
            self.abort()
            return
        self._relieve()

    # Connection -------------------------------------------------------------------------------

    def _write_soon(self) -> None:
        """Write at the end of this loop iteration: the calls that finish in the same one (the
        model's answers come back together) go out in one send."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        self._write()
        if self._core.closing and not self._core.streams:
            self._close()

    def _write(self) -> None:
        data = self._core.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._written += len(data)
            self._transport.write(data)

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def shutdown(self) -> None:
        """GOAWAY: no new calls; the connection closes once the open ones are done."""
        if self._transport is None:  # still in its TLS handshake, or that failed: forget it
            self.connection_lost(None)
            return
        self._core.goaway()
        self._write()
        if not self._core.streams:
            self._close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _handshake_due(self) -> None:
        if not self._core.handshaken:
            logger.info("gRPC client %s did not finish the HTTP/2 handshake: closed", self._peer)
            if self._transport is not None:
                self.abort()
            else:  # the TLS handshake failed: no connection_lost will come
                self.connection_lost(None)
            return
        self._arm_idle()

    def _arm_idle(self) -> None:
        # Four quiet looks in a row (no stream open, none started) make an idle connection:
        # nothing is done per call.
        interval = self._server.limits.idle_timeout_s / 4
        self._timer = asyncio.get_running_loop().call_later(interval, self._idle_tick)

    def _idle_tick(self) -> None:
        core = self._core
        if core.streams or core.opened != self._seen:
            self._seen, self._idle_ticks = core.opened, 0
        else:
            self._idle_ticks += 1
            if self._idle_ticks >= 4:
                core.goaway("max_idle")
                self._write()
                self._close()
                return
        self._arm_idle()


def _peer(address: Any) -> str:
    """grpc's peer string: "ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:path"."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return f"unix:{address}" if address else ""


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed as accepted (grpc core does the same)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class LoopGrpcServer:
    """The listening socket and its connections."""

    def __init__(
        self,
        methods: dict[str, Method],
        *,
        max_message_bytes: int,
        limits: ConnectionLimits,
    ) -> None:
        self.methods = methods
        self.max_message_bytes = max_message_bytes
        self.limits = limits
        self.connections: set[GrpcProtocol] = set()
        self._listener: asyncio.Server | None = None

    def _protocol(self) -> asyncio.Protocol:
        if len(self.connections) >= self.limits.max_connections:
            return _Refused()
        return GrpcProtocol(self)

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen; returns the bound port. Raises: OSError: the port cannot be bound."""
        self._listener = await asyncio.get_running_loop().create_server(
            self._protocol,
            host,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=ssl_context,
            ssl_handshake_timeout=self.limits.header_timeout_s if ssl_context else None,
        )
        return int(self._listener.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, GOAWAY every connection, wait up to `grace` for open calls."""
        if self._listener is not None:
            self._listener.close()
        connections = list(self.connections)
        for conn in connections:
            conn.shutdown()
        waiting: list[Awaitable[None]] = [conn.closed for conn in connections]
        if waiting:
            _, late = await asyncio.wait(
                [asyncio.ensure_future(w) for w in waiting], timeout=grace or 0
            )
            if late:
                for conn in list(self.connections):
                    conn.abort()
                await asyncio.wait(late, timeout=5)
