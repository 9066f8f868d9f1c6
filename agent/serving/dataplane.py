"""Transport-agnostic server logic: health, metadata, config, repository index and inference.

HTTP, gRPC and MQTT parse their own wire format into `agent.tensors.request` types, call this, and
serialize the result. Inference runs on the model's executor (or inline, for tiny models:
see `agent.scheduling.scheduler`).

`DataPlane` is the one facade, composed of parts that each get what they need when it makes
them: the `RequestRouter` (`agent.serving.routing`: the prologue every inference runs: route,
admit), `RequestTraces` (`agent.serving.request_traces`), `ModelControl`
(`agent.serving.model_control`: load, unload, activate, roll back) and `StreamedInference`
(`agent.serving.streamed_inference`). The unary `infer` lives here; the facade passes the other
calls on to their part.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent import __version__
from agent.canary.control import CanaryManager
from agent.ensemble.plan import output_order
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
from agent.models.inflight import InflightBytes
from agent.models.pushed import PushedModels
from agent.models.registry import ModelRegistry
from agent.models.served import ServedModel
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import config_to_json
from agent.scheduling.statistics import FailureReason
from agent.serving.class_labels import ClassLabels
from agent.serving.client_text import PathScrubber
from agent.serving.cuda_regions import CudaRegionRegistry
from agent.serving.cuda_shared_memory import CudaRegions, CudaSharedMemory
from agent.serving.log_settings import LogSettings
from agent.serving.model_control import ModelControl
from agent.serving.request_parameters import (
    ensemble_parameters,
    now_ms,
    request_context,
    scheduling_parameters,
)
from agent.serving.request_traces import RequestTraces
from agent.serving.response_cache import ResponseCache, cache_key
from agent.serving.response_stream import StreamedResponse
from agent.serving.routing import RequestRouter
from agent.serving.shared_memory import SharedMemoryRegistry
from agent.serving.streamed_inference import StreamedInference
from agent.tensors import datatypes
from agent.tensors.classification import top_k
from agent.tensors.request import (
    InferRequest,
    InferResponse,
    OutputTensor,
    classified_outputs,
    shared_memory_outputs,
)
from agent.tracing.tracer import Trace, Tracer

logger = logging.getLogger(__name__)

SERVER_NAME = "edge-agent"
EXTENSIONS = (
    "classification",
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


class DataPlane:
    """The agent's request handling, shared by every transport (see the module docstring for
    its parts)."""

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
        strict_readiness: bool = True,
    ) -> None:
        self._registry = registry
        # Triton's --strict-readiness: ready only while every known model version serves.
        self.strict_readiness = strict_readiness
        self._cache = cache
        self.canary = canary or CanaryManager(registry)
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.log_settings = log_settings or LogSettings()
        self.tracer = tracer or Tracer()
        self._ready = False
        self.server_name = server_name
        self._no_cuda = CudaSharedMemory(self.shared_memory)
        # What a client-facing message must not show: the repository and the model cache.
        pushed_root = [pushed.root] if pushed is not None else []
        self.scrub = PathScrubber([registry.repository, *pushed_root, *private_paths])
        manager = manager or ModelManager(registry)
        self._traces = RequestTraces(self.tracer)
        self._labels = ClassLabels()
        self._router = RequestRouter(registry, manager, self.canary, self._traces)
        self._control = ModelControl(
            registry,
            manager,
            cache=cache,
            mode=mode,
            versions=versions,
            # Models loaded from files sent with the load request (None: such loads refused).
            pushed=pushed,
            max_request_bytes=max_request_bytes,
            scrub=self.scrub,
        )
        self._streams = StreamedInference(registry, self._router, self._traces, self.infer)
        # Ensemble steps and Python models' BLS requests are ordinary inferences.
        registry.step_runner.bind(self.infer, self.infer_stream)

    @property
    def manager(self) -> ModelManager:
        """Loads, unloads and hot-swaps models (its swap gate holds requests meanwhile)."""
        return self._control.manager

    @manager.setter
    def manager(self, manager: ModelManager) -> None:
        self._control.manager = manager
        self._router.manager = manager

    @property
    def mode(self) -> ModelControlMode:
        return self._control.mode

    @property
    def versions(self) -> CachedVersions | None:
        """The model cache's versions (None: a plain repository)."""
        return self._control.versions

    @versions.setter
    def versions(self, versions: CachedVersions | None) -> None:
        self._control.versions = versions

    @property
    def pushed(self) -> PushedModels | None:
        """Models loaded from files sent with the load request (None: such loads are refused)."""
        return self._control.pushed

    @property
    def inflight(self) -> InflightBytes | None:
        """The memory budget's pool for requests in flight, which every transport asks before it
        takes a request's bytes (None: an agent without a budget, as in tools and tests)."""
        ledger = self._registry.ledger
        return ledger.inflight if ledger is not None else None

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
        """Ready once start-up is done and until the stop begins; with strict readiness (the
        default, as Triton's), also only while every model the repository knows serves: each
        version READY with an instance serving, or unloaded on purpose
        (`ModelRegistry.all_ready`)."""
        if not self._ready:
            return False
        return not self.strict_readiness or self._registry.all_ready()

    def cpu_fallbacks(self) -> dict[tuple[str, int], str]:
        """Loaded versions running without the accelerators their configs ask for (the
        operator allowed it: models.allow_cpu_fallback), with what they run on instead."""
        return self._registry.cpu_fallbacks()

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
        served, number = self._registry.resolve(name, version)
        sig = served.signature
        # the number as Triton writes it ("01" asks for version 1)
        versions = [str(number)] if version else [str(v) for v in sorted(served.versions)]
        return {
            "name": served.name,
            "versions": versions,
            # Triton's: the platform, else the backend ("python" for a Python model)
            "platform": served.config.platform or served.config.backend,
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
            trace = self._traces.child(name, request)
        if trace is not None:
            trace.stamp("REQUEST_START", start)
        params = request.parameters
        route = await self._router.route(name, version, params)
        served, number, loaded = route.served, route.number, route.loaded
        if served.config.model_transaction_policy.decoupled:
            raise UnsupportedError(refusal or _decoupled_refusal(served.name))
        if trace is not None:
            trace.model_version = number
        stats = loaded.stats
        version_text = str(number)
        answer: Mapping[str, Any] | None = (
            ensemble_parameters(route.sequence) if served.config.platform == "ensemble" else None
        )
        key: bytes | None = None
        in_shm = shared_memory_outputs(request)
        admitted = False
        try:
            if in_shm or any(t.shm is not None for t in request.inputs):
                request = self.shared_memory.resolve_inputs(request)
            valid = self._router.admit(route, request, trace)
            context = request_context(
                request, route.sequence.correlation_id if route.sequence is not None else 0
            )
            if context is not None:  # most requests have none: the fast path stays as it is
                valid = replace(valid, context=context)
            admitted = True
            priority, timeout_us = scheduling_parameters(params) if params else (None, None)
            if self._cache is not None and served.config.response_cache.enable:
                lookup = time.perf_counter_ns()
                # Keyed by the build, not the version number: a version rebuilt under the same
                # number (poll reload, re-activation) never answers from the old build's entries.
                key = cache_key(served.name, loaded.build_id, request.inputs, valid.output_names)
                cached = self._cache.get(key)
                if cached is not None:
                    hit = self._classify(served, request, cached.outputs)
                    self.shared_memory.place_outputs(hit, in_shm)
                    now = time.perf_counter_ns()
                    stats.record_cache_hit(ns=now - lookup, now_ms=now_ms(), request_ns=now - start)
                    self._router.outcome(name, route, start, None)
                    if trace is not None:
                        self._traces.end(trace, hit)
                    if answer is None:
                        answer = cached.parameters  # those the model answered the miss with
                    return InferResponse(served.name, version_text, hit, request.id, answer)
                stats.record_cache_miss(ns=time.perf_counter_ns() - lookup)
            queued = time.perf_counter_ns() if trace is not None else 0
            if route.sequence is not None:
                self._router.started(route)
            result = await loaded.scheduler.submit(
                valid, priority=priority, timeout_us=timeout_us, sequence=route.sequence
            )
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
                OutputTensor(
                    n, datatypes.answered(sig.outputs[n].datatype, data), sig.shape_output(n, data)
                )
                for n, data in result.named(valid.output_names)
            )
            if answer is not None:  # an ensemble: its outputs in the order its steps make them
                rank = output_order(served.config)
                outputs = tuple(sorted(outputs, key=lambda o: rank.get(o.name, len(rank))))
            answered = self._classify(served, request, outputs)
            self.shared_memory.place_outputs(answered, in_shm)
        except Exception as exc:
            error = InternalError.wrap(exc)
            if error is not exc:
                logger.exception("model %s version %d: request failed", served.name, number)
            if isinstance(error, ModelInstanceFailedError):
                self._router.instance_failed(route, error)
            # As Triton: a request its model refused (bad inputs) counts nowhere, and one the
            # model ran and answered with an error (a Python model's response) is a success.
            if admitted and error.answered is not None:
                queue_ns, input_ns, infer_ns, output_ns = error.answered
                stats.record_success(
                    request_ns=time.perf_counter_ns() - start,
                    queue_ns=queue_ns,
                    compute_input_ns=input_ns,
                    compute_infer_ns=infer_ns,
                    compute_output_ns=output_ns,
                    now_ms=now_ms(),
                )
            elif admitted:
                stats.record_failure(
                    request_ns=time.perf_counter_ns() - start,
                    reason=_failure_reason(error),
                    now_ms=now_ms(),
                )
            self._router.outcome(name, route, start, error)
            if trace is not None:
                self._traces.end(trace, ())
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
            self._cache.put(
                key, outputs, model=served.name, version=version_text, parameters=result.parameters
            )
        self._router.outcome(name, route, start, None)
        if trace is not None:
            self._traces.end(trace, answered)
        if answer is None:
            answer = result.parameters  # the model's own (a Python model's response parameters)
        return InferResponse(served.name, version_text, answered, request.id, answer)

    def _classify(
        self, served: ServedModel, request: InferRequest, outputs: tuple[OutputTensor, ...]
    ) -> tuple[OutputTensor, ...]:
        """The outputs asked for with `classification: K` replaced by their top K classes."""
        classes = classified_outputs(request)
        if not classes:
            return outputs
        batched = served.signature.batched
        return tuple(
            out
            if out.name not in classes
            else OutputTensor(
                out.name,
                "BYTES",
                top_k(
                    out.data,
                    classes[out.name],
                    out.datatype,
                    self._labels.of(served, out.name),
                    batched=batched,
                ),
            )
            for out in outputs
        )

    def infer_stream(
        self, name: str, version: str | None, request: InferRequest
    ) -> AsyncGenerator[StreamedResponse, None]:
        """Every response of a request, for any model (`StreamedInference.infer_stream`).

        Errors before the model takes the request are raised (as `infer` raises them); after
        that they come as items. Closing the iterator before the final item cancels the request.
        """
        return self._streams.infer_stream(name, version, request)

    # Model control (`agent.serving.model_control`).

    def repository_index(
        self, ready_only: bool = False, *, detailed: bool = False
    ) -> list[dict[str, str]]:
        return self._control.repository_index(ready_only, detailed=detailed)

    async def load_model(
        self,
        name: str,
        config: dict[str, Any] | None,
        files: Mapping[str, bytes] | None = None,
    ) -> str:
        """Explicit load (or reload) of a model (`ModelControl.load_model`)."""
        return await self._control.load_model(name, config, files)

    async def unload_model(self, name: str) -> None:
        """Explicit unload; queued requests finish first (`ModelControl.unload_model`)."""
        await self._control.unload_model(name)

    async def activate_version(self, name: str, version: int) -> str:
        """Hot-swap a model to a cached version; the strategy (`ModelControl.activate_version`)."""
        return await self._control.activate_version(name, version)

    async def rollback(self, name: str, to_version: int | None) -> int:
        """Go back to a retained version; returns it (`ModelControl.rollback`)."""
        return await self._control.rollback(name, to_version)

    def cached_versions(self, name: str) -> list[dict[str, Any]]:
        return self._control.cached_versions(name)

    async def clear_rejected(self, name: str, version: int | None, *, by: str) -> list[int]:
        """Let the sync activate rejected versions again (`ModelControl.clear_rejected`)."""
        return await self._control.clear_rejected(name, version, by=by)

    def rejected_versions(self) -> list[dict[str, Any]]:
        """Versions rejected on this device, with cause and reason ([] without a cache)."""
        return self._control.rejected_versions()


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
