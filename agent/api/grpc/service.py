"""KServe v2 over gRPC (Triton's GRPCInferenceService): the one servicer both engines run.

Thin like the HTTP handlers: decode, call the shared data plane, encode. Neither engine is known
here: `rpcs()` lists every method with its request and response types (None: the method takes or
returns the message's bytes), and each engine registers that list, the loop engine
(`agent.api.grpc.loop`) and grpc.aio (`agent.api.grpc.aio`) alike. A method reads its call
through `Call` (peer, metadata) and ends a call only by raising `StatusError`:

* `STATUS_FOR_ERROR` is the one place where agent errors become gRPC status codes (read through
  `agent.errors.lookup`); an unexpected exception is logged and answered INTERNAL with its message;
* restricted protocol groups (`agent.api.access`) are checked before a method runs, here, so
  both engines refuse the same calls with the same status;
* ModelInfer has one decode route (`grpc_wire.decode_infer`: the fast path for the requests
  clients repeat, else the full parse) whatever the engine and whether tracing is on, and
  ModelStreamInfer decodes each of its requests through the same function.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from agent.api.access import (
    ApiAccess,
    RestrictedApiError,
    grpc_endpoint,
    require_local_registrant,
)
from agent.api.grpc import codec as grpc_codec
from agent.api.grpc import wire as grpc_wire
from agent.api.grpc.status import DESERIALIZE_FAILED, Status, StatusError
from agent.api.http.limits import ClientTimeoutError, StoppingError
from agent.api.model_load import ModelLoadFailedError, invalid_override, load_model
from agent.api.tls import TlsError
from agent.errors import (
    AccessDeniedError,
    AgentError,
    BackendError,
    CacheCommitError,
    ConflictError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    MemoryPressureError,
    ModelConfigError,
    ModelControlDisabledError,
    ModelControlError,
    ModelInstanceFailedError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelReportedCancelledError,
    ModelReportedError,
    ModelReportedExistsError,
    ModelReportedInvalidArgError,
    ModelReportedNotFoundError,
    ModelReportedUnavailableError,
    ModelReportedUnknownError,
    ModelReportedUnsupportedError,
    NoReadyVersionError,
    OverloadedError,
    PayloadTooLargeError,
    RegionExistsError,
    RepositoryPollError,
    RequestTimeoutError,
    SharedMemoryNotFoundError,
    UnknownTensorError,
    UnsupportedError,
    lookup,
)
from agent.models.inflight import Hold, body_cost
from agent.models.pushed import FILE_PREFIX
from agent.proto import grpc_service_pb2 as pb
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = ["STATUS_FOR_ERROR", "Call", "InferenceService", "Rpc", "status_for"]

logger = logging.getLogger(__name__)

STATUS_FOR_ERROR: dict[type[AgentError], Status] = {
    InvalidInputError: Status.INVALID_ARGUMENT,
    UnknownTensorError: Status.INVALID_ARGUMENT,
    ModelConfigError: Status.INVALID_ARGUMENT,
    ModelControlError: Status.FAILED_PRECONDITION,
    ModelLoadFailedError: Status.INVALID_ARGUMENT,
    ModelNotFoundError: Status.NOT_FOUND,
    AccessDeniedError: Status.PERMISSION_DENIED,
    RestrictedApiError: Status.UNAVAILABLE,  # Triton's answer to a restricted protocol
    NoReadyVersionError: Status.NOT_FOUND,
    SharedMemoryNotFoundError: Status.NOT_FOUND,
    ConflictError: Status.ALREADY_EXISTS,
    RegionExistsError: Status.ALREADY_EXISTS,
    ClientTimeoutError: Status.DEADLINE_EXCEEDED,
    PayloadTooLargeError: Status.RESOURCE_EXHAUSTED,
    ModelNotReadyError: Status.UNAVAILABLE,
    ModelControlDisabledError: Status.UNAVAILABLE,
    OverloadedError: Status.UNAVAILABLE,
    MemoryPressureError: Status.RESOURCE_EXHAUSTED,
    StoppingError: Status.UNAVAILABLE,  # HTTP only; listed for completeness
    RequestTimeoutError: Status.UNAVAILABLE,
    BackendError: Status.INTERNAL,
    ModelInstanceFailedError: Status.INTERNAL,
    ModelReportedError: Status.INTERNAL,  # a model's TritonError: Triton's code for its code
    ModelReportedUnknownError: Status.UNKNOWN,
    ModelReportedNotFoundError: Status.NOT_FOUND,
    ModelReportedInvalidArgError: Status.INVALID_ARGUMENT,
    ModelReportedUnavailableError: Status.UNAVAILABLE,
    ModelReportedUnsupportedError: Status.UNIMPLEMENTED,
    ModelReportedExistsError: Status.ALREADY_EXISTS,
    ModelReportedCancelledError: Status.CANCELLED,
    CacheCommitError: Status.INTERNAL,
    ModelLoadError: Status.INTERNAL,
    RepositoryPollError: Status.INTERNAL,
    MemoryBudgetError: Status.INTERNAL,
    InternalError: Status.INTERNAL,
    UnsupportedError: Status.UNIMPLEMENTED,
    TlsError: Status.INTERNAL,
    AgentError: Status.INTERNAL,
}

# Triton's answer to ModelInfer on a decoupled model (UNIMPLEMENTED).
_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
# The methods that take the request's bytes (they decode through `grpc_wire.decode_infer`), and
# the one that returns the response's bytes.
_STREAM_AHEAD = 16  # a stream's answers made before the engine takes them
_BYTES_IN = frozenset({"ModelInfer", "ModelStreamInfer"})
_BYTES_OUT = frozenset({"ModelInfer"})

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def status_for(error: BaseException) -> Status:
    """The gRPC status for an error (any non-`AgentError` is an `InternalError`: INTERNAL)."""
    return lookup(STATUS_FOR_ERROR, error)


class Call(Protocol):
    """What a method reads of its call (grpc.aio's ServicerContext has it; so does the loop
    engine's context)."""

    def peer(self) -> str: ...

    def invocation_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...


@dataclass(frozen=True, slots=True)
class Rpc:
    """One method of the service as an engine registers it.

    `handler(request, call)` returns the response (an async iterator of them when
    `server_streaming`); with `client_streaming` its request is an async iterator. A type of
    None means the handler takes (returns) the message's bytes: the engine neither parses nor
    serializes it.
    """

    name: str
    path: str  # "/inference.GRPCInferenceService/ModelInfer"
    handler: Callable[..., Any]
    request_type: type[Message] | None
    response_type: type[Message] | None
    client_streaming: bool
    server_streaming: bool


# The RPC in progress (each runs in its own task): its peer, for shared-memory registration.
_call: contextvars.ContextVar[Call] = contextvars.ContextVar("grpc_call")


def _mapped(
    handler: Callable[[Any, Req], Awaitable[Resp]],
) -> Callable[[Any, Req, Call], Awaitable[Resp]]:
    async def wrapper(self: InferenceService, request: Req, call: Call) -> Resp:
        _call.set(call)
        try:
            return await handler(self, request)
        except Exception as exc:
            raise self._status_error(exc, handler.__name__) from exc

    return wrapper


def _releaser(hold: Hold) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback giving `hold` back."""
    return lambda _: hold.release()


def _require_local_caller() -> None:
    """Refuse a shared-memory registration from a peer off this host."""
    call = _call.get(None)
    require_local_registrant(call.peer() if call is not None else None)


def _metadata(call: Call) -> dict[str, str]:
    """The call's text metadata by lower-case key."""
    return {str(k).lower(): v for k, v in call.invocation_metadata() or () if isinstance(v, str)}


class InferenceService:
    """The gRPC servicer over the shared data plane (see the module doc).

    `access`: Triton's restricted protocol groups (`access.grpc`), None when not enforced.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        limits: TensorLimits | None = None,
        access: ApiAccess | None = None,
    ) -> None:
        self._dp = dataplane
        self._limits = limits
        self._access = access

    def rpcs(self) -> tuple[Rpc, ...]:
        """Every method of GRPCInferenceService, in the order the proto declares them."""
        out = []
        for method in _SERVICE.methods:
            name = method.name
            path = f"/{_SERVICE.full_name}/{name}"
            handler = getattr(self, name)
            if self._access is not None:
                handler = self._gated(path, handler, method.server_streaming)
            out.append(
                Rpc(
                    name,
                    path,
                    handler,
                    None if name in _BYTES_IN else getattr(pb, method.input_type.name),
                    None if name in _BYTES_OUT else getattr(pb, method.output_type.name),
                    method.client_streaming,
                    method.server_streaming,
                )
            )
        return tuple(out)

    def _gated(self, path: str, handler: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        """`handler`, refusing a call to a restricted group without its metadata first."""
        if streaming:

            async def stream(requests: Any, call: Call) -> AsyncIterator[Any]:
                self._admit(path, call)
                async with contextlib.aclosing(handler(requests, call)) as replies:
                    async for reply in replies:
                        yield reply

            return stream

        async def unary(request: Any, call: Call) -> Any:
            self._admit(path, call)
            return await handler(request, call)

        return unary

    def _admit(self, path: str, call: Call) -> None:
        assert self._access is not None
        refusal = self._access.grpc.refusal(grpc_endpoint(path), _metadata(call))
        if refusal is not None:
            raise StatusError(status_for(RestrictedApiError(refusal)), refusal)

    def _status_error(self, exc: Exception, name: str) -> StatusError:
        """The status that ends a call failed with `exc` (logged with its traceback when it is a
        bug; call it in the `except` block)."""
        if isinstance(exc, StatusError):
            return exc
        if not isinstance(exc, AgentError):
            logger.exception("gRPC %s failed", name)
        error = InternalError.wrap(exc)
        # no path of the device in what the client reads
        return StatusError(status_for(error), self._dp.scrub(error.message))

    # Inference: one decode route ------------------------------------------------------------

    def _decode(self, data: bytes) -> grpc_wire.DecodedInfer:
        """A serialized ModelInferRequest, decoded (the one route of both infer RPCs).

        Raises:
            StatusError: the bytes are not a ModelInferRequest (INTERNAL, grpcio's words).
            InvalidInputError, PayloadTooLargeError: as `grpc_wire.decode_infer`.
        """
        try:
            return grpc_wire.decode_infer(data, limits=self._limits)
        except DecodeError:
            raise StatusError(Status.INTERNAL, DESERIALIZE_FAILED) from None

    async def ModelInfer(self, data: bytes, call: Call) -> bytes:
        """ModelInfer from the request's bytes to the response's, on both engines.

        The message is held in the memory budget's pool for requests in flight until the reply
        is handed to the engine (RESOURCE_EXHAUSTED when it does not fit); what then waits for
        the peer is each engine's per-connection cap."""
        hold: Hold | None = None
        try:
            hold = self._hold(data)
            if self._dp.tracer.active:
                return await self._infer_traced(data, call)
            decoded = self._decode(data)
            response = await self._dp.infer(
                decoded.model_name, decoded.model_version, decoded.request, refusal=_REFUSAL
            )
            return grpc_wire.encode_serialized(response, decoded.request)
        except Exception as exc:
            raise self._status_error(exc, "ModelInfer") from exc
        finally:
            if hold is not None:
                hold.release()

    def _hold(self, data: bytes) -> Hold | None:
        """Hold a request message's bytes in flight (None: no pool, or nothing to hold).

        Raises:
            MemoryPressureError: the message does not fit in the pool now (RESOURCE_EXHAUSTED).
        """
        pool = self._dp.inflight
        if pool is None:
            return None
        return pool.hold(
            body_cost(len(data), binary=True),
            f"a request message of {len(data) / (1 << 20):.1f} MiB",
        )

    async def _infer_traced(self, data: bytes, call: Call) -> bytes:
        """ModelInfer with Triton's gRPC timestamps when the request is sampled for tracing."""
        read = time.perf_counter_ns()
        decoded = self._decode(data)
        request = decoded.request
        trace = self._dp.tracer.start(decoded.model_name, request.id or "")
        if trace is None:
            response = await self._dp.infer(
                decoded.model_name, decoded.model_version, request, refusal=_REFUSAL
            )
            return grpc_wire.encode_serialized(response, request)
        trace.stamp("GRPC_WAITREAD_END", read)
        trace.propagate(_metadata(call))
        try:
            response = await self._dp.infer(
                decoded.model_name, decoded.model_version, request, trace, refusal=_REFUSAL
            )
            trace.stamp("GRPC_SEND_START")
            reply = grpc_wire.encode_serialized(response, request)
            trace.stamp("GRPC_SEND_END")
            return reply
        finally:
            self._dp.tracer.finish(trace)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[bytes], call: Call
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every response of every request on the stream, requests served concurrently.

        Each response carries Triton's `triton_final_response` parameter; a decoupled model's
        final flag without a response is sent as an empty response only when the request set
        `triton_enable_empty_final_response`. An error goes back as error_message and the stream
        goes on; bytes that are not a ModelInferRequest end the stream (INTERNAL). When the
        client cancels the stream (or goes away), its requests are cancelled.
        """
        _call.set(call)
        # (message, whether it took room): None ends the stream.
        out: asyncio.Queue[tuple[pb.ModelStreamInferResponse, bool] | None] = asyncio.Queue()
        # Answers made ahead of the engine taking them: past this a model's answers wait (a
        # decoupled model is paused by its response iterator), not piled up here.
        room = asyncio.Semaphore(_STREAM_AHEAD)
        running: set[asyncio.Task[None]] = set()

        async def serve(decoded: grpc_wire.DecodedInfer) -> None:
            async for message in self._stream_one(decoded):
                await room.acquire()
                out.put_nowait((message, True))

        async def read() -> None:
            try:
                # Requests are decoded and their tasks started in arrival order, and each reaches
                # its model's queue without waiting: requests that share a queue keep the order.
                async for data in requests:
                    hold: Hold | None = None
                    try:
                        hold = self._hold(data)  # in flight until its last answer is made
                        decoded = self._decode(data)
                    except AgentError as exc:
                        if hold is not None:
                            hold.release()
                        out.put_nowait((self._stream_error(exc), False))
                        continue
                    task = asyncio.ensure_future(serve(decoded))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    if hold is not None:
                        task.add_done_callback(_releaser(hold))
                while running:  # the client half-closed: finish what it asked for
                    await asyncio.wait(set(running))
            finally:
                out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await out.get()) is not None:
                message, took_room = item
                if took_room:
                    room.release()
                yield message
            await reader  # a broken request stream surfaces here
        except Exception as exc:
            raise self._status_error(exc, "ModelStreamInfer") from exc
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()  # closes each request's response iterator: the model sees it

    async def _stream_one(
        self, decoded: grpc_wire.DecodedInfer
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The stream messages of one request (errors as error_message)."""
        request = decoded.request
        empty_final = request.parameters.get("triton_enable_empty_final_response") is True
        try:
            async for item in self._dp.infer_stream(
                decoded.model_name, decoded.model_version, request
            ):
                if item.error is not None:
                    yield pb.ModelStreamInferResponse(
                        error_message=self._dp.scrub(item.error.message)
                    )
                    continue
                if item.response is None:
                    if not (item.final and empty_final):
                        continue
                    message = pb.ModelInferResponse(
                        model_name=decoded.model_name,
                        model_version=decoded.model_version or "",
                        id=request.id or "",
                    )
                else:
                    message = grpc_codec.encode_infer_response(item.response, request)
                message.parameters["triton_final_response"].bool_param = item.final
                yield pb.ModelStreamInferResponse(infer_response=message)
        except AgentError as exc:
            yield self._stream_error(exc)
        except Exception as exc:
            logger.exception("gRPC ModelStreamInfer failed")
            yield self._stream_error(InternalError.wrap(exc))

    def _stream_error(self, error: AgentError) -> pb.ModelStreamInferResponse:
        """A request's error as its stream message (the stream goes on)."""
        return pb.ModelStreamInferResponse(error_message=self._dp.scrub(error.message))

    # Everything else: typed messages --------------------------------------------------------

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
