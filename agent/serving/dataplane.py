"""Transport-agnostic server logic: health, metadata, config, repository index and inference.

HTTP, gRPC and MQTT parse their own wire format into `agent.tensors.request` types, call this, and
serialize the result. Inference runs on the model's executor (or inline, for tiny models:
see `agent.scheduling.scheduler`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent import __version__
from agent.canary.control import CanaryManager
from agent.ensemble.runner import EnsembleScheduler
from agent.errors import (
    AgentError,
    BackendError,
    InternalError,
    InvalidInputError,
    ModelInstanceFailedError,
    ModelNotFoundError,
    ModelNotReadyError,
    OverloadedError,
    RequestTimeoutError,
    UnsupportedError,
)
from agent.models.cache_control import CachedVersions
from agent.models.control import ModelControlMode, ModelManager
from agent.models.pushed import PushedModels
from agent.models.registry import ModelRegistry
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import config_to_json
from agent.scheduling.sequence_policy import sequence_parameters
from agent.scheduling.sequence_scheduler import SequenceScheduler
from agent.scheduling.statistics import FailureReason
from agent.serving.client_text import PathScrubber
from agent.serving.cuda_regions import CudaRegionRegistry
from agent.serving.cuda_shared_memory import CudaRegions, CudaSharedMemory
from agent.serving.log_settings import LogSettings
from agent.serving.model_control import ModelControl
from agent.serving.request_parameters import now_ms, scheduling_parameters
from agent.serving.response_cache import ResponseCache, cache_key
from agent.serving.sequence_routes import SequenceRoutes
from agent.serving.shared_memory import SharedMemoryRegistry
from agent.serving.streamed_inference import StreamedInference
from agent.tensors.request import InferRequest, InferResponse, OutputTensor, shared_memory_outputs
from agent.tensors.signature import ModelSignature, ValidatedRequest
from agent.tracing.tensors import BACKEND_INPUT, BACKEND_OUTPUT, QUEUE_INPUT
from agent.tracing.tracer import Trace, Tracer

logger = logging.getLogger(__name__)

SERVER_NAME = "edge-agent"
EXTENSIONS = (
    "binary_tensor_data",
    "logging",
    "model_configuration",
    "model_repository",
    "parameters",
    "schedule_policy",
    "statistics",
    "system_shared_memory",
    "trace",
)


class DataPlane(ModelControl, StreamedInference):
    """The agent's request handling, shared by every transport (model control:
    `agent.serving.model_control`; streamed responses: `agent.serving.streamed_inference`)."""

    def __init__(
        self,
        registry: ModelRegistry,
        cache: ResponseCache | None = None,
        manager: ModelManager | None = None,
        mode: ModelControlMode = ModelControlMode.NONE,
        versions: CachedVersions | None = None,
        canary: CanaryManager | None = None,
        shared_memory: SharedMemoryRegistry | None = None,
        log_settings: LogSettings | None = None,
        tracer: Tracer | None = None,
        pushed: PushedModels | None = None,
        max_request_bytes: int = 64 * 1024 * 1024,
        *,
        server_name: str = SERVER_NAME,
        private_paths: Iterable[Path] = (),
    ) -> None:
        self._registry = registry
        self._cache = cache
        self._sequences = SequenceRoutes()  # live sequences stay on the version they started on
        self.manager = manager or ModelManager(registry)
        self.mode = mode
        self.versions = versions
        self.canary = canary or CanaryManager(registry)
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.log_settings = log_settings or LogSettings()
        self.tracer = tracer or Tracer()
        # Models loaded from files sent with the load request (None: such loads are refused).
        self.pushed = pushed
        self._max_request_bytes = max_request_bytes
        self._ready = False
        self._changes: set[asyncio.Future[Any]] = set()  # model-control changes under way
        self.server_name = server_name
        self._no_cuda = CudaSharedMemory(self.shared_memory)
        # What a client-facing message must not show: the repository and the model cache.
        pushed_root = [pushed.root] if pushed is not None else []
        self.scrub = PathScrubber([registry.repository, *pushed_root, *private_paths])
        # Ensemble steps and Python models' BLS requests are ordinary inferences.
        registry.step_runner.bind(self.infer, self.infer_stream)

    @property
    def cuda_shared_memory(self) -> CudaRegions:
        """The CUDA regions the endpoints use: the registry the daemon hooked into the shared
        memory (`shared_memory.device`, where CUDA is present), else Triton's no-GPU answers."""
        device = self.shared_memory.device
        return device if isinstance(device, CudaRegionRegistry) else self._no_cuda

    def set_ready(self, ready: bool) -> None:
        """Ready once start-up loading is done; not ready again while shutting down."""
        self._ready = ready

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return self._ready

    def server_metadata(self) -> dict[str, Any]:
        extensions = [
            e for e in EXTENSIONS if e != "system_shared_memory" or self.shared_memory.enabled
        ]
        if isinstance(self.shared_memory.device, CudaRegionRegistry):
            extensions.append("cuda_shared_memory")  # as Triton built with GPU support lists it
        return {"name": self.server_name, "version": __version__, "extensions": extensions}

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the addressed model version is READY (raises ModelNotFoundError if unknown)."""
        try:
            self._registry.resolve(name, version)
        except ModelNotReadyError:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """KServe model metadata; -1 marks a dimension of any size."""
        served, _ = self._registry.resolve(name, version)
        sig = served.signature
        versions = [version] if version else [str(v) for v in sorted(served.versions)]
        return {
            "name": served.name,
            "versions": versions,
            "platform": served.config.platform,
            "inputs": [c.metadata(sig.batched) for c in sig.inputs.values()],
            "outputs": [c.metadata(sig.batched) for c in sig.outputs.values()],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The completed config in Triton's JSON form."""
        served, _ = self._registry.resolve(name, version)
        return config_to_json(served.config)

    def model_config_message(self, name: str, version: str | None) -> mc.ModelConfig:
        """The completed config as the protobuf message (for gRPC)."""
        served, _ = self._registry.resolve(name, version)
        return served.config

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics extension for all models, one model, or one version.

        Raises:
            InvalidInputError: the model or version is unknown or not ready (Triton: 400).
        """
        if name is not None:
            try:
                served, number = self._registry.resolve(name, version)
            except (ModelNotFoundError, ModelNotReadyError):  # Triton's words and code (400)
                if not version:
                    raise InvalidInputError(f"requested model '{name}' is not available") from None
                raise InvalidInputError(
                    f"requested model version is not available for model '{name}'"
                ) from None
            return self._registry.stats.snapshot(served.name, str(number) if version else None)
        return self._registry.stats.snapshot()

    def trace_setting(
        self, model: str | None, changes: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Triton's trace settings, global or one model's; `changes` (POST) updates them first.

        Raises:
            InvalidInputError: the model is unknown or not ready, or a setting is refused.
        """
        if model is not None:
            try:
                ready = self.model_ready(model, None)
            except ModelNotFoundError:
                ready = False
            if not ready:
                raise InvalidInputError(f"Request for unknown model : {model}")
        if changes is None:
            return self.tracer.settings(model)
        return self.tracer.update(model, changes)

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: Trace | None = None,
        *,
        refusal: str | None = None,
    ) -> InferResponse:
        """Validate a request, answer from the response cache or queue it on the scheduler.

        `trace` (tracing on and this request sampled) collects the request's timestamps. A
        request with a `parent_trace` (an ensemble step or a BLS request of a traced request)
        gets a child trace, finished here.
        `refusal`: the transport's wording when the model is decoupled (one response per call
        cannot serve it: `infer_stream` does).

        Raises:
            ModelNotFoundError, ModelNotReadyError: the model or version cannot serve.
            InvalidInputError: the request does not match the model.
            OverloadedError, RequestTimeoutError: the queue is full or its timeout expired.
            BackendError: the runtime failed.
            ModelInstanceFailedError: an instance hung or died; the version is UNAVAILABLE now.
            InternalError: an unexpected exception (a bug), logged with its traceback; like
                every failure it is counted in the statistics and told to the canary.
            UnsupportedError: the model is decoupled.
        """
        start = time.perf_counter_ns()
        if trace is None and request.parent_trace is not None:
            trace = self._child_trace(name, request)
        if trace is not None:
            trace.stamp("REQUEST_START", start)
        params = request.parameters
        sequence = sequence_parameters(params) if params else None  # most requests have none
        owner = None if version or sequence is None else self._sequences.find(name, sequence)
        if owner is None:  # a live sequence's old build is draining: its requests must not wait
            await self.manager.wait_if_swapping(name)
        routed = None if version or owner else self.canary.route(name)  # canary: unversioned only
        served, number = owner or self._registry.resolve(name, str(routed) if routed else version)
        loaded = served.versions[number]
        if served.config.model_transaction_policy.decoupled:
            raise UnsupportedError(refusal or _decoupled_refusal(served.name))
        if trace is not None:
            trace.model_version = number
        stats = loaded.stats
        version_text = str(number)
        key: bytes | None = None
        in_shm = shared_memory_outputs(request)
        try:
            if in_shm or any(t.shm is not None for t in request.inputs):
                request = self.shared_memory.resolve_inputs(request)
            try:
                valid = served.signature.validate(request)
            except InvalidInputError as exc:  # Triton's words open with the request's id
                tag = request.id or "<id_unknown>"
                raise InvalidInputError(f"[request id: {tag}] {exc.message}") from None
            if trace is not None:
                valid = self._trace_inputs(trace, request, valid, served.signature)
            priority, timeout_us = scheduling_parameters(params) if params else (None, None)
            if self._cache is not None and served.config.response_cache.enable:
                lookup = time.perf_counter_ns()
                # Keyed by the build, not the version number: a version rebuilt under the same
                # number (poll reload, re-activation) never answers from the old build's entries.
                key = cache_key(served.name, loaded.build_id, request.inputs, valid.output_names)
                hit = self._cache.get(key)
                if hit is not None:
                    self.shared_memory.place_outputs(hit, in_shm)
                    now = time.perf_counter_ns()
                    stats.record_cache_hit(ns=now - lookup, now_ms=now_ms(), request_ns=now - start)
                    self._canary_outcome(name, routed, start, None)
                    if trace is not None:
                        self._trace_end(trace, hit)
                    return InferResponse(served.name, version_text, hit, request.id)
                stats.record_cache_miss(ns=time.perf_counter_ns() - lookup)
            queued = time.perf_counter_ns() if trace is not None else 0
            if isinstance(loaded.scheduler, SequenceScheduler):
                self._sequences.started(served.name, sequence, served, number)
                submitted = loaded.scheduler.submit(valid, sequence, timeout_us=timeout_us)
            elif isinstance(loaded.scheduler, EnsembleScheduler):
                submitted = loaded.scheduler.submit(
                    valid, priority=priority, timeout_us=timeout_us, sequence=sequence
                )
            else:
                submitted = loaded.scheduler.submit(valid, priority=priority, timeout_us=timeout_us)
            result = await submitted
            if trace is not None:
                trace.executed(
                    queued,
                    result.queue_ns,
                    result.compute_input_ns,
                    result.compute_infer_ns,
                    result.compute_output_ns,
                )
            sig = served.signature
            outputs = tuple(
                OutputTensor(n, sig.outputs[n].datatype, sig.shape_output(n, data))
                for n, data in zip(valid.output_names, result.outputs, strict=True)
            )
            self.shared_memory.place_outputs(outputs, in_shm)
        except Exception as exc:
            error = InternalError.wrap(exc)
            if error is not exc:
                logger.exception("model %s version %d: request failed", served.name, number)
            if isinstance(error, ModelInstanceFailedError):
                self._registry.mark_failed(served.name, number, error.message, loaded=loaded)
            stats.record_failure(
                request_ns=time.perf_counter_ns() - start,
                reason=_failure_reason(error),
                now_ms=now_ms(),
            )
            self._canary_outcome(name, routed, start, error)
            if trace is not None:
                self._trace_end(trace, ())
            if error is exc:
                raise
            raise error from exc
        stats.record_success(
            request_ns=time.perf_counter_ns() - start,
            queue_ns=result.queue_ns,
            compute_input_ns=result.compute_input_ns,
            compute_infer_ns=result.compute_infer_ns,
            compute_output_ns=result.compute_output_ns,
            now_ms=now_ms(),
        )
        if key is not None and self._cache is not None:
            self._cache.put(key, outputs, model=served.name, version=version_text)
        self._canary_outcome(name, routed, start, None)
        if trace is not None:
            self._trace_end(trace, outputs)
        return InferResponse(served.name, version_text, outputs, request.id)

    def _child_trace(self, name: str, request: InferRequest) -> Trace | None:
        parent = request.parent_trace
        if not isinstance(parent, Trace):
            return None
        return self.tracer.spawn(parent, name, request.id or "")

    @staticmethod
    def _trace_inputs(
        trace: Trace, request: InferRequest, valid: ValidatedRequest, signature: ModelSignature
    ) -> ValidatedRequest:
        """The inputs' tensor entries (level TENSORS); the request carries its trace on, so
        that an ensemble's steps and a Python model's BLS requests become its children."""
        if trace.tensors:
            for tensor in request.inputs:
                trace.tensor(QUEUE_INPUT, tensor.name, tensor.datatype, tensor.data)
            for name, data in valid.feeds.items():
                contract = signature.inputs.get(name)
                datatype = contract.datatype if contract is not None else ""
                trace.tensor(BACKEND_INPUT, name, datatype, data)
        return replace(valid, trace=trace)

    def _trace_end(self, trace: Trace, outputs: tuple[OutputTensor, ...] | tuple[()]) -> None:
        if trace.tensors:
            for tensor in outputs:
                trace.tensor(BACKEND_OUTPUT, tensor.name, tensor.datatype, tensor.data)
        trace.stamp("REQUEST_END")
        if trace.parent is not None:  # a child: no transport finishes it
            self.tracer.finish(trace)

    def _canary_outcome(
        self, name: str, routed: int | None, start_ns: int, error: AgentError | None
    ) -> None:
        """Tell the canary how a request it routed went (latency from arrival to answer)."""
        if routed is not None:
            self.canary.record(name, routed, (time.perf_counter_ns() - start_ns) // 1000, error)


def _decoupled_refusal(name: str) -> str:
    return (
        f"model '{name}' uses the decoupled transaction policy: its responses are streamed "
        "(gRPC ModelStreamInfer, HTTP generate_stream)"
    )


def _failure_reason(error: AgentError) -> FailureReason:
    if isinstance(error, OverloadedError | RequestTimeoutError):
        return "REJECTED"
    if isinstance(error, BackendError):
        return "BACKEND"
    if isinstance(error, ModelNotReadyError | ModelNotFoundError):
        return "CANCELED"
    return "OTHER"
