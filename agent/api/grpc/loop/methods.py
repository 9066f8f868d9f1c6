"""The loop engine's method table (the servicer's `rpcs()` by path), and its start-up."""

from __future__ import annotations

from agent.api.access import ApiAccess
from agent.api.grpc.loop.server import LoopGrpcServer, Method
from agent.api.grpc.service import InferenceService, Rpc
from agent.api.http.limits import ConnectionLimits
from agent.api.tls import ServerTls
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = ["method_table", "start_loop_grpc_server"]


def method_table(rpcs: tuple[Rpc, ...]) -> dict[str, Method]:
    """Every RPC by its path ("/inference.GRPCInferenceService/ModelInfer").

    ModelInfer goes from bytes to bytes (its request type is None): its common requests never
    become protobuf objects.
    """
    return {
        rpc.path: Method(
            rpc.handler, rpc.request_type, rpc.client_streaming or rpc.server_streaming
        )
        for rpc in rpcs
    }


async def start_loop_grpc_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    *,
    max_message_bytes: int,
    tensor_limits: TensorLimits | None = None,
    connection_limits: ConnectionLimits | None = None,
    access: ApiAccess | None = None,
    tls: ServerTls | None = None,
) -> tuple[LoopGrpcServer, int]:
    """Start the loop gRPC server (the same arguments as the grpc.aio engine's start).

    `access`: Triton's restricted protocol groups (`access.grpc`); `tls`: serve TLS (ALPN h2,
    mutual TLS when it has a client CA). Returns the server (`await server.stop(grace)`) and the
    bound port.

    Raises:
        OSError: the port cannot be bound.
    """
    server = LoopGrpcServer(
        method_table(InferenceService(dataplane, tensor_limits, access).rpcs()),
        max_message_bytes=max_message_bytes,
        limits=connection_limits or ConnectionLimits(),
    )
    bound = await server.start(host, port, tls.h2_ssl_context() if tls is not None else None)
    return server, bound
