"""The "grpcio" gRPC engine (`server.grpc_engine = "grpcio"`): the servicer on grpc.aio.

grpc core does the HTTP/2; this module registers `InferenceService.rpcs()` as generic handlers
(a method whose type is None gets no (de)serializer: ModelInfer goes from bytes to bytes here as
on the loop engine) and turns the servicer's `StatusError` into `context.abort` with grpcio's
`grpc.StatusCode`. The connection limits become grpc core's channel options.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from typing import Any

import grpc

from agent.api.access import ApiAccess
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
    handlers = {rpc.name: _handler(rpc) for rpc in servicer.rpcs()}
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


def _handler(rpc: Rpc) -> grpc.RpcMethodHandler[Any, Any]:
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
        try:
            return await method(request, context)
        except StatusError as exc:
            await context.abort(grpcio_code(exc.status), exc.message)

    if rpc.client_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    return grpc.unary_unary_rpc_method_handler(unary, **codec)


def _connection_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """grpc core's counterparts of the HTTP connection limits."""
    return [
        # Connections over the cap are closed as they are accepted.
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        # A client that does not finish the HTTP/2 handshake (preface, SETTINGS) in time: cut.
        ("grpc.server_handshake_timeout_ms", int(limits.header_timeout_s * 1000)),
        # A connection without RPCs for this long gets GOAWAY (then closes).
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
    ]
