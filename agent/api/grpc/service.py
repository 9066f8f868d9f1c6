"""KServe v2 gRPC endpoint (`grpc.aio`), Triton's GRPCInferenceService.

Thin like the HTTP handlers: decode with `agent.api.grpc.codec`, call the shared data plane, encode.
`STATUS_FOR_ERROR` is the one place where agent errors become gRPC status codes (read through
`agent.errors.lookup`); an unexpected exception is logged and answered INTERNAL with its message.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from agent.api.access import (
    ApiAccess,
    RestrictedApiError,
    grpc_endpoint,
    require_local_registrant,
)
from agent.api.grpc import codec as grpc_codec
from agent.api.grpc import wire as grpc_wire
from agent.api.http.limits import ClientTimeoutError, ConnectionLimits, StoppingError
from agent.api.model_load import ModelLoadFailedError, invalid_override, load_model
from agent.api.tls import ServerTls, TlsError
from agent.errors import (
    AccessDeniedError,
    AgentError,
    BackendError,
    CacheCommitError,
    ConflictError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    ModelConfigError,
    ModelControlDisabledError,
    ModelControlError,
    ModelInstanceFailedError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NoReadyVersionError,
    OverloadedError,
    PayloadTooLargeError,
    RegionExistsError,
    RepositoryPollError,
    RequestTimeoutError,
    SharedMemoryNotFoundError,
    UnsupportedError,
    lookup,
)
from agent.models.pushed import FILE_PREFIX
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

logger = logging.getLogger(__name__)

STATUS_FOR_ERROR: dict[type[AgentError], grpc.StatusCode] = {
    InvalidInputError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelControlError: grpc.StatusCode.FAILED_PRECONDITION,
    ModelLoadFailedError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    AccessDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    RestrictedApiError: grpc.StatusCode.UNAVAILABLE,  # Triton's answer to a restricted protocol
    NoReadyVersionError: grpc.StatusCode.NOT_FOUND,
    SharedMemoryNotFoundError: grpc.StatusCode.NOT_FOUND,
    ConflictError: grpc.StatusCode.ALREADY_EXISTS,
    RegionExistsError: grpc.StatusCode.ALREADY_EXISTS,
    ClientTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    PayloadTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ModelNotReadyError: grpc.StatusCode.UNAVAILABLE,
    ModelControlDisabledError: grpc.StatusCode.UNAVAILABLE,
    OverloadedError: grpc.StatusCode.UNAVAILABLE,
    StoppingError: grpc.StatusCode.UNAVAILABLE,  # HTTP only; listed for completeness
    RequestTimeoutError: grpc.StatusCode.UNAVAILABLE,
    BackendError: grpc.StatusCode.INTERNAL,
    ModelInstanceFailedError: grpc.StatusCode.INTERNAL,
    CacheCommitError: grpc.StatusCode.INTERNAL,
    ModelLoadError: grpc.StatusCode.INTERNAL,
    RepositoryPollError: grpc.StatusCode.INTERNAL,
    MemoryBudgetError: grpc.StatusCode.INTERNAL,
    InternalError: grpc.StatusCode.INTERNAL,
    UnsupportedError: grpc.StatusCode.UNIMPLEMENTED,
    TlsError: grpc.StatusCode.INTERNAL,
    AgentError: grpc.StatusCode.INTERNAL,
}

# Triton's answer to ModelInfer on a decoupled model (UNIMPLEMENTED).
_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def status_for(error: BaseException) -> grpc.StatusCode:
    """The gRPC status for an error (any non-`AgentError` is an `InternalError`: INTERNAL)."""
    return lookup(STATUS_FOR_ERROR, error)


# The RPC in progress (each runs in its own task): its metadata carries the W3C trace context.
_call: contextvars.ContextVar[grpc.aio.ServicerContext[Any, Any]] = contextvars.ContextVar(
    "grpc_call"
)


def _mapped(
    handler: Callable[[Any, Req], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    async def wrapper(
        self: Any, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
    ) -> Resp:
        _call.set(context)
        try:
            return await handler(self, request)
        except Exception as exc:
            await _abort(context, exc, self._dp, handler.__name__)
            raise  # abort raises; this keeps type checkers satisfied

    return wrapper


async def _abort(context: Any, exc: Exception, dataplane: DataPlane, name: str) -> None:
    """End the call with the error's status (logged with its traceback when it is a bug)."""
    if not isinstance(exc, AgentError):
        logger.exception("gRPC %s failed", name)
    error = InternalError.wrap(exc)
    # no path of the device in what the client reads
    await context.abort(status_for(error), dataplane.scrub(error.message))


def _require_local_caller() -> None:
    """Refuse a shared-memory registration from a peer off this host."""
    call = _call.get(None)
    require_local_registrant(call.peer() if call is not None else None)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The gRPC servicer over the shared data plane."""

    def __init__(self, dataplane: DataPlane, limits: TensorLimits | None = None) -> None:
        self._dp = dataplane
        self._limits = limits

    @_mapped
    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dp.server_live())

    @_mapped
    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dp.server_ready())

    @_mapped
    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        try:
            ready = self._dp.model_ready(request.name, request.version or None)
        except ModelNotFoundError:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @_mapped
    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self._dp.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    @_mapped
    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self._dp.model_metadata(request.name, request.version or None)
        response = pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for key, target in (("inputs", response.inputs), ("outputs", response.outputs)):
            for tensor in meta[key]:
                target.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    @_mapped
    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        return await self._infer(request)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext[pb.ModelInferRequest, pb.ModelStreamInferResponse],
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every response of every request on the stream, requests served concurrently.

        Each response carries Triton's `triton_final_response` parameter; a decoupled model's
        final flag without a response is sent as an empty response only when the request set
        `triton_enable_empty_final_response`. An error goes back as error_message and the stream
        goes on. When the client cancels the stream (or goes away), its requests are cancelled.
        """
        _call.set(context)
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            async for message in self._stream_one(request):
                out.put_nowait(message)

        async def read() -> None:
            try:
                # Tasks start in arrival order and reach their model's queue without waiting,
                # so requests that share a queue keep the stream's order.
                async for request in request_iterator:
                    task = asyncio.ensure_future(serve(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:  # the client half-closed: finish what it asked for
                    await asyncio.wait(set(running))
            finally:
                out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (message := await out.get()) is not None:
                yield message
            await reader  # a broken request iterator surfaces here
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()  # closes each request's response iterator: the model sees it

    async def _stream_one(
        self, request: pb.ModelInferRequest
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The stream messages of one request (errors as error_message)."""
        empty_final = _bool_parameter(request, "triton_enable_empty_final_response")
        version = request.model_version or None
        try:
            infer_request = grpc_codec.decode_infer_request(request, limits=self._limits)
            async for item in self._dp.infer_stream(request.model_name, version, infer_request):
                if item.error is not None:
                    yield pb.ModelStreamInferResponse(
                        error_message=self._dp.scrub(item.error.message)
                    )
                    continue
                if item.response is None:
                    if not (item.final and empty_final):
                        continue
                    message = pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    )
                else:
                    message = grpc_codec.encode_infer_response(item.response, infer_request)
                message.parameters["triton_final_response"].bool_param = item.final
                yield pb.ModelStreamInferResponse(infer_response=message)
        except AgentError as exc:
            yield pb.ModelStreamInferResponse(error_message=self._dp.scrub(exc.message))
        except Exception as exc:
            logger.exception("gRPC ModelStreamInfer failed")
            text = self._dp.scrub(InternalError.wrap(exc).message)
            yield pb.ModelStreamInferResponse(error_message=text)

    @_mapped
    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(
            self._dp.model_config_message(request.name, request.version or None)
        )
        return response

    @_mapped
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        doc = self._dp.statistics(request.name or None, request.version or None)
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(doc, response, ignore_unknown_fields=True)
        return response

    @_mapped
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for row in self._dp.repository_index(request.ready):
            response.models.add(
                name=row["name"],
                version=row.get("version", ""),
                state=row.get("state", ""),
                reason=row.get("reason", ""),
            )
        return response

    @_mapped
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        config: dict[str, Any] | None = None
        files: dict[str, bytes] = {}  # load with files: Triton's "file:<path>" bytes_param
        for key, param in request.parameters.items():
            kind = param.WhichOneof("parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise InvalidInputError(
                        f"invalid value type for load parameter '{key}', expected string_param."
                    )
                try:
                    parsed = json.loads(param.string_param)
                except ValueError as exc:
                    raise invalid_override(
                        request.model_name, f"parameter 'config' is not valid JSON: {exc}"
                    ) from None
                if not isinstance(parsed, dict):
                    raise invalid_override(
                        request.model_name, "parameter 'config' must be a JSON object"
                    )
                config = parsed
            elif key.startswith(FILE_PREFIX):
                if kind != "bytes_param":
                    raise InvalidInputError(
                        f"invalid value type for load parameter '{key}', expected bytes_param."
                    )
                files[key] = param.bytes_param
            else:
                raise InvalidInputError(f"unrecognized load parameter '{key}'.")
        await load_model(self._dp, request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @_mapped
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        await self._dp.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @_mapped
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._dp.shared_memory.status(request.name or None):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name,
                    key=region.key,
                    offset=region.offset,
                    byte_size=region.byte_size,
                )
            )
        return response

    @_mapped
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        _require_local_caller()
        self._dp.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_mapped
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            self._dp.shared_memory.unregister(request.name)
        else:
            self._dp.shared_memory.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory: device memory where CUDA is, else Triton's no-GPU answers ------------

    @_mapped
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self._dp.cuda_shared_memory.status(request.name or None):
            response.regions[region.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, device_id=region.device_id, byte_size=region.byte_size
                )
            )
        return response

    @_mapped
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        _require_local_caller()
        self._dp.cuda_shared_memory.register(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @_mapped
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._dp.cuda_shared_memory.unregister(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------------------------------------

    @_mapped
    async def TraceSetting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        changes = grpc_codec.decode_trace_settings(request)  # none: a read, as in Triton
        settings = self._dp.trace_setting(request.model_name or None, changes or None)
        return grpc_codec.encode_trace_settings(settings)

    @_mapped
    async def LogSettings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        settings = self._dp.log_settings.update(grpc_codec.decode_log_settings(request))
        return grpc_codec.encode_log_settings(settings)

    async def infer_serialized(self, data: bytes, context: Any) -> bytes:
        """ModelInfer from the request's bytes to the response's (the loop engine calls this).

        A request in the shape clients repeat skips the protobuf objects (`grpc_wire`); any
        other, and every request while tracing is on, is parsed whole and served by ModelInfer.
        """
        _call.set(context)
        decoded = None
        try:
            if not self._dp.tracer.active:
                decoded = grpc_wire.decode_serialized(data, limits=self._limits)
            if decoded is not None:
                plan, request = decoded
                response = await self._dp.infer(
                    plan.model_name, plan.model_version, request, refusal=_REFUSAL
                )
                return grpc_wire.encode_serialized(response, request)
        except Exception as exc:
            await _abort(context, exc, self._dp, "ModelInfer")
            raise
        try:
            message = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            await context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
            raise
        reply: pb.ModelInferResponse = await self.ModelInfer(message, context)
        return reply.SerializeToString()

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        if self._dp.tracer.active:
            return await self._infer_traced(request)
        infer_request = grpc_codec.decode_infer_request(request, limits=self._limits)
        response = await self._dp.infer(
            request.model_name, request.model_version or None, infer_request, refusal=_REFUSAL
        )
        return grpc_codec.encode_infer_response(response, infer_request)

    async def _infer_traced(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        """`_infer` with Triton's gRPC timestamps when the request is sampled for tracing."""
        read = time.perf_counter_ns()
        trace = self._dp.tracer.start(request.model_name, request.id)
        infer_request = grpc_codec.decode_infer_request(request, limits=self._limits)
        version = request.model_version or None
        if trace is None:
            response = await self._dp.infer(
                request.model_name, version, infer_request, refusal=_REFUSAL
            )
            return grpc_codec.encode_infer_response(response, infer_request)
        trace.stamp("GRPC_WAITREAD_END", read)
        call = _call.get(None)
        if call is not None:
            metadata = call.invocation_metadata() or ()
            trace.propagate({str(k): v for k, v in metadata if isinstance(v, str)})
        try:
            response = await self._dp.infer(
                request.model_name, version, infer_request, trace, refusal=_REFUSAL
            )
            trace.stamp("GRPC_SEND_START")
            message = grpc_codec.encode_infer_response(response, infer_request)
            trace.stamp("GRPC_SEND_END")
            return message
        finally:
            self._dp.tracer.finish(trace)


def _bool_parameter(request: pb.ModelInferRequest, key: str) -> bool:
    param = request.parameters.get(key)
    return (
        param is not None
        and param.WhichOneof("parameter_choice") == "bool_param"
        and (param.bool_param)
    )


class _RestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to a restricted protocol group without its metadata (`agent.api.access`)."""

    def __init__(self, access: ApiAccess) -> None:
        self._access = access

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        pairs = details.invocation_metadata or ()
        metadata = {str(k).lower(): v for k, v in pairs if isinstance(v, str)}
        refusal = self._access.grpc.refusal(grpc_endpoint(details.method), metadata)
        handler = await continuation(details)
        if refusal is None or handler is None:
            return handler
        return _refusing(handler, refusal)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape that answers Triton's refusal without running the method."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(status_for(RestrictedApiError(message)), message)

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **codec)
    return grpc.unary_unary_rpc_method_handler(refuse, **codec)


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
    """Start the gRPC server; returns it and the bound port (useful with port 0).

    `access`: Triton's restricted protocol groups (`access.grpc`); `tls`: serve TLS (mutual TLS
    when it has a client CA), its certificate reloaded in place.

    Raises:
        OSError: the port cannot be bound.
    """
    server = grpc.aio.server(
        interceptors=[_RestrictionInterceptor(access)] if access is not None else None,
        options=[
            # A message over the limit is refused (RESOURCE_EXHAUSTED) from its length prefix.
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *_connection_options(connection_limits or ConnectionLimits()),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceService(dataplane, tensor_limits), server
    )
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
