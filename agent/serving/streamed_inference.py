"""The streamed inference path: every response of a request, for decoupled models (one request,
any number of responses) and, as a stream of one, for every other model.

A mixin of `DataPlane` (the transports' one facade), so a streamed request costs no call more than
when the path lived in the data plane itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Protocol

from agent.canary.control import CanaryManager
from agent.errors import AgentError, InvalidInputError, ModelInstanceFailedError
from agent.models.control import ModelManager
from agent.models.registry import ModelRegistry
from agent.scheduling.sequence_policy import sequence_parameters
from agent.scheduling.sequence_scheduler import SequenceScheduler
from agent.serving.decoupled import stream_responses
from agent.serving.request_parameters import now_ms, scheduling_parameters
from agent.serving.response_stream import StreamedResponse
from agent.serving.sequence_routes import SequenceRoutes
from agent.tensors.request import InferRequest, InferResponse, shared_memory_outputs
from agent.tensors.signature import ModelSignature, ValidatedRequest
from agent.tracing.tracer import Trace, Tracer


class _Plane(Protocol):
    """What the streamed path uses of `DataPlane`, the class it is mixed into."""

    _registry: ModelRegistry
    _sequences: SequenceRoutes
    manager: ModelManager
    canary: CanaryManager
    tracer: Tracer

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: Trace | None = None,
        *,
        refusal: str | None = None,
    ) -> InferResponse: ...

    def _child_trace(self, name: str, request: InferRequest) -> Trace | None: ...

    @staticmethod
    def _trace_inputs(
        trace: Trace, request: InferRequest, valid: ValidatedRequest, signature: ModelSignature
    ) -> ValidatedRequest: ...

    def _canary_outcome(
        self, name: str, routed: int | None, start_ns: int, error: AgentError | None
    ) -> None: ...

    def _stream_trace(self, name: str, request: InferRequest) -> Trace | None: ...

    def _stream_trace_end(self: _Plane, trace: Trace) -> None: ...


class StreamedInference:
    """`DataPlane.infer_stream` and the traces of streamed requests."""

    async def infer_stream(
        self: _Plane, name: str, version: str | None, request: InferRequest
    ) -> AsyncGenerator[StreamedResponse, None]:
        """Every response of a request, for any model (`agent.serving.response_stream`).

        Errors before the model takes the request are raised (as `infer` raises them); after
        that they come as items. Closing the iterator before the final item cancels the request
        (the model's `request.is_cancelled()` turns true).
        """
        served, _ = self._registry.resolve(name, version)
        if not served.config.model_transaction_policy.decoupled:
            yield StreamedResponse(await self.infer(name, version, request))
            return
        start = time.perf_counter_ns()
        sequence = sequence_parameters(request.parameters)
        owner = None if version else self._sequences.find(name, sequence)
        if owner is None:  # a live sequence's old build is draining: its requests must not wait
            await self.manager.wait_if_swapping(name)
        routed = None if version or owner else self.canary.route(name)  # canary: unversioned
        served, number = owner or self._registry.resolve(name, str(routed) if routed else version)
        loaded = served.versions[number]
        if isinstance(loaded.scheduler, SequenceScheduler):
            self._sequences.started(served.name, sequence, served, number)
        trace = self._stream_trace(name, request)
        if trace is not None:
            trace.stamp("REQUEST_START", start)
            trace.model_version = number
        try:
            if any(t.shm is not None for t in request.inputs) or shared_memory_outputs(request):
                raise InvalidInputError(
                    "shared-memory tensors are not supported with decoupled models"
                )
            valid = served.signature.validate(request)
            if trace is not None:  # an ensemble's steps become its children
                valid = self._trace_inputs(trace, request, valid, served.signature)
            priority, timeout_us = scheduling_parameters(request.parameters)
        except AgentError as exc:
            loaded.stats.record_failure(
                request_ns=time.perf_counter_ns() - start, reason="OTHER", now_ms=now_ms()
            )
            self._canary_outcome(name, routed, start, exc)
            if trace is not None:
                self._stream_trace_end(trace)
            raise
        responses = stream_responses(
            served,
            loaded,
            valid,
            request.id,
            priority=priority,
            timeout_us=timeout_us,
            start_ns=start,
            sequence=sequence,
        )
        failed: AgentError | None = None  # the request's first error, for the canary
        try:
            async for item in responses:
                if isinstance(item.error, ModelInstanceFailedError):
                    self._registry.mark_failed(
                        served.name, number, item.error.message, loaded=loaded
                    )
                failed = failed or item.error
                if item.final:  # judged once complete (a client that left is not judged)
                    self._canary_outcome(name, routed, start, failed)
                if trace is not None and (item.response is not None or item.error is not None):
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                yield item
        except AgentError as exc:
            if isinstance(exc, ModelInstanceFailedError):
                self._registry.mark_failed(served.name, number, exc.message, loaded=loaded)
            self._canary_outcome(name, routed, start, exc)
            raise
        finally:
            await responses.aclose()
            if trace is not None:
                self._stream_trace_end(trace)

    def _stream_trace(self: _Plane, name: str, request: InferRequest) -> Trace | None:
        """A streamed request's trace: the child of the request that made it (an ensemble step,
        a BLS call), or its own when the settings sample it."""
        if request.parent_trace is not None:
            return self._child_trace(name, request)
        if self.tracer.active:
            return self.tracer.start(name, request.id or "")
        return None

    def _stream_trace_end(self: _Plane, trace: Trace) -> None:
        """The streamed request ended (final flag, failure or the client gone): keep its trace
        (no transport finishes a stream's trace)."""
        trace.stamp("REQUEST_END")
        self.tracer.finish(trace)
