"""The "grpcio" gRPC engine (`server.grpc_engine = "grpcio"`): the servicer on grpc.aio.

grpc core does the HTTP/2; this module registers `InferenceService.rpcs()` as generic handlers
(a method whose type is None gets no (de)serializer: ModelInfer goes from bytes to bytes here as
on the loop engine) and turns the servicer's `StatusError` into `context.abort` with grpcio's
`grpc.StatusCode`. The connection limits become grpc core's channel options.

Back-pressure: grpc core keeps reading a connection and holds every answer it cannot write
(flow-control windows of 2^31-1 let it queue them all), so a unary call runs only when its
connection's `SendBudget` (`agent.api.grpc.sending`, keyed by the call's peer address) admits it,
and counts there until grpc core reports the call done, which is once its answer has left grpc
core's buffers for the socket (`add_done_callback`). A call not admitted waits, unrun. A
streaming answer's send already waits for grpc core to take it. A stalled client is closed by
grpc core's keepalive: a PING with calls open every half `send_timeout_s`, unanswered within the
other half: closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from agent.api.access import ApiAccess
from agent.api.grpc.sending import SendBudget
from agent.api.grpc.service import InferenceService, Rpc
from agent.api.grpc.status import Status, StatusError
from agent.api.http.limits import ConnectionLimits
from agent.api.tls import ServerTls
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = ["grpcio_code", "start_grpc_server"]

_SERVICE = "inference.GRPCInferenceService"
_GRPCIO_CODES = {code.value[0]: code for code in grpc.StatusCode}


def grpcio_code(status: Status) -> grpc.StatusCode:
    """grpcio's enum member for a status."""
    return _GRPCIO_CODES[int(status)]


async def start_grpc_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    *,
    max_message_bytes: int,
    tensor_limits: TensorLimits | None = None,
    connection_limits: ConnectionLimits | None = None,
    access: ApiAccess | None = None,
    tls: ServerTls | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start the grpc.aio server; returns it and the bound port (useful with port 0).

    `access`: Triton's restricted protocol groups (`access.grpc`); `tls`: serve TLS (mutual TLS
    when it has a client CA), its certificate reloaded in place.

    Raises:
        OSError: the port cannot be bound.
    """
    server = grpc.aio.server(
        options=[
            # A message over the limit is refused (RESOURCE_EXHAUSTED) from its length prefix.
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *_connection_options(connection_limits or ConnectionLimits()),
        ],
    )
    servicer = InferenceService(dataplane, tensor_limits, access)
    gates = _ConnectionGates()
    handlers = {rpc.name: _handler(rpc, gates) for rpc in servicer.rpcs()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    try:
        address = f"{host}:{port}"
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError:  # grpcio >= 1.60 raises where older versions returned port 0
        bound = 0
    if bound == 0:
        raise OSError(errno.EADDRINUSE, f"cannot bind gRPC on {host}:{port}")
    await server.start()
    return server, bound


class _Ticket:
    """One unary call's place at its connection's gate."""

    __slots__ = ("admitted", "future", "gate", "left", "peer")

    def __init__(self, gate: _Gate, peer: str) -> None:
        self.gate = gate
        self.peer = peer
        self.admitted = False
        self.left = False
        self.future: asyncio.Future[None] | None = None


class _Gate:
    __slots__ = ("budget", "waiting")

    def __init__(self) -> None:
        self.budget = SendBudget()
        self.waiting: deque[_Ticket] = deque()


class _ConnectionGates:
    """Each connection's send budget (by peer address) and the calls waiting on it."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    async def enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> _Gate:
        """Wait until the call's connection admits it; it counts there until the call is done."""
        peer = context.peer()
        gate = self._gates.get(peer)
        if gate is None:
            gate = self._gates[peer] = _Gate()
        ticket = _Ticket(gate, peer)
        # (grpc-stubs declare the callback a nominal class, not a Protocol)
        context.add_done_callback(lambda _: self._leave(ticket))  # type: ignore[arg-type]
        if not gate.waiting and gate.budget.admit(0):
            ticket.admitted = True
            gate.budget.started()
            return gate
        ticket.future = asyncio.get_running_loop().create_future()
        gate.waiting.append(ticket)
        await ticket.future  # resolved by `_admit` (admitted), cancelled by `_leave`
        return gate

    def _leave(self, ticket: _Ticket) -> None:
        if ticket.left:
            return
        ticket.left = True
        gate = ticket.gate
        if ticket.admitted:
            gate.budget.ended()
        elif ticket.future is not None:
            ticket.future.cancel()
        self._admit(gate)
        if gate.budget.running == 0 and not gate.waiting:
            self._gates.pop(ticket.peer, None)

    @staticmethod
    def _admit(gate: _Gate) -> None:
        waiting = gate.waiting
        while waiting and gate.budget.admit(0):
            ticket = waiting.popleft()
            if ticket.left or ticket.future is None or ticket.future.done():
                continue
            ticket.admitted = True
            gate.budget.started()
            ticket.future.set_result(None)


def _size(reply: Any) -> int:
    return len(reply) if isinstance(reply, bytes) else int(reply.ByteSize())


def _handler(rpc: Rpc, gates: _ConnectionGates) -> grpc.RpcMethodHandler[Any, Any]:
    """grpc.aio's handler for one method: the servicer's `StatusError` becomes `abort`."""
    codec: dict[str, Callable[..., Any] | None] = {
        "request_deserializer": rpc.request_type.FromString if rpc.request_type else None,
        "response_serializer": rpc.response_type.SerializeToString if rpc.response_type else None,
    }
    method = rpc.handler
    if rpc.server_streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                async with contextlib.aclosing(method(request, context)) as replies:
                    async for reply in replies:
                        yield reply
            except StatusError as exc:
                await context.abort(grpcio_code(exc.status), exc.message)

        if rpc.client_streaming:
            return grpc.stream_stream_rpc_method_handler(stream, **codec)
        return grpc.unary_stream_rpc_method_handler(stream, **codec)

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        gate = await gates.enter(context)
        try:
            reply = await method(request, context)
            gate.budget.answered(_size(reply))
            return reply
        except StatusError as exc:
            await context.abort(grpcio_code(exc.status), exc.message)

    if rpc.client_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    return grpc.unary_unary_rpc_method_handler(unary, **codec)


def _connection_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """grpc core's counterparts of the HTTP connection limits."""
    half_send = max(1, int(limits.send_timeout_s * 500))
    return [
        # Connections over the cap are closed as they are accepted.
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        # A client that does not finish the HTTP/2 handshake (preface, SETTINGS) in time: cut.
        ("grpc.server_handshake_timeout_ms", int(limits.header_timeout_s * 1000)),
        # A connection without RPCs for this long gets GOAWAY (then closes).
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
        # Streams open at once per connection (the loop engine's figure): calls over it refused.
        ("grpc.max_concurrent_streams", 1024),
        # A client backed up that answers no PING for send_timeout_s: closed (with calls open).
        ("grpc.keepalive_time_ms", half_send),
        ("grpc.keepalive_timeout_ms", half_send),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),  # a stalled connection sends no data
    ]
