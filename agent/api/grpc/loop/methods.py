"""The GRPCInferenceService's methods for the loop engine, and its start-up."""

from __future__ import annotations

from agent.api.access import ApiAccess
from agent.api.grpc.loop.server import LoopGrpcServer, Method
from agent.api.grpc.service import InferenceService
from agent.api.http.limits import ConnectionLimits
from agent.api.tls import ServerTls
from agent.proto import grpc_service_pb2 as pb
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = ["method_table", "start_loop_grpc_server"]


def method_table(servicer: InferenceService) -> dict[str, Method]:
    """Every RPC of the service by its path ("/inference.GRPCInferenceService/ModelInfer")."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    table = {
        f"/{service.full_name}/{method.name}": Method(
            getattr(servicer, method.name),
            getattr(pb, method.input_type.name),
            method.client_streaming or method.server_streaming,
        )
        for method in service.methods
    }
    # ModelInfer goes from bytes to bytes: its common requests never become protobuf objects.
    infer = f"/{service.full_name}/ModelInfer"
    table[infer] = Method(servicer.infer_serialized, pb.ModelInferRequest, False, serialized=True)
    return table


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
    """Start the loop gRPC server (the same arguments as `start_grpc_server`).

    Returns the server (`await server.stop(grace)`) and the bound port.

    Raises:
        OSError: the port cannot be bound.
    """
    server = LoopGrpcServer(
        method_table(InferenceService(dataplane, tensor_limits)),
        max_message_bytes=max_message_bytes,
        limits=connection_limits or ConnectionLimits(),
        access=access,
    )
    bound = await server.start(host, port, tls.h2_ssl_context() if tls is not None else None)
    return server, bound
