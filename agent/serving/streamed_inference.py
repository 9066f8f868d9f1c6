"""The streamed inference path: every response of a request, for decoupled models (one request,
any number of responses) and, as a stream of one, for every other model.

A part of `DataPlane`, the transports' one facade: it routes and admits a request through the
same `RequestRouter` as the unary path (`DataPlane.infer`, which it also calls for a model that
is not decoupled), and runs it through `agent.serving.decoupled`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace

from agent.errors import AgentError, InvalidInputError, ModelInstanceFailedError
from agent.models.registry import ModelRegistry
from agent.serving.decoupled import stream_responses
from agent.serving.request_parameters import request_context, scheduling_parameters
from agent.serving.request_traces import RequestTraces
from agent.serving.response_stream import StreamedResponse
from agent.serving.routing import RequestRouter
from agent.tensors.request import InferRequest, InferResponse, shared_memory_outputs

__all__ = ["StreamedInference", "UnaryInference"]

# The data plane's unary `infer`: one response per request.
UnaryInference = Callable[[str, str | None, InferRequest], Awaitable[InferResponse]]


class StreamedInference:
    """`DataPlane.infer_stream`: the responses of one request as the model sends them."""

    def __init__(
        self,
        registry: ModelRegistry,
        router: RequestRouter,
        traces: RequestTraces,
        unary: UnaryInference,
    ) -> None:
        self._registry = registry
        self._router = router
        self._traces = traces
        self._unary = unary

    async def infer_stream(
        self, name: str, version: str | None, request: InferRequest
    ) -> AsyncGenerator[StreamedResponse, None]:
        """Every response of a request, for any model (`agent.serving.response_stream`).

        Errors before the model takes the request are raised (as `infer` raises them); after
        that they come as items. Closing the iterator before the final item cancels the request
        (the model's `request.is_cancelled()` turns true).
        """
        served, _ = self._registry.resolve(name, version)
        if not served.config.model_transaction_policy.decoupled:
            yield StreamedResponse(await self._unary(name, version, request))
            return
        start = time.perf_counter_ns()
        route = await self._router.route(name, version, request.parameters)
        trace = self._traces.stream(name, request)
        if trace is not None:
            trace.stamp("REQUEST_START", start)
            trace.model_version = route.number
        try:
            if any(t.shm is not None for t in request.inputs) or shared_memory_outputs(request):
                raise InvalidInputError(
                    "shared-memory tensors are not supported with decoupled models"
                )
            valid = self._router.admit(route, request, trace)  # an ensemble's steps: children
            context = request_context(
                request, route.sequence.correlation_id if route.sequence is not None else 0
            )
            if context is not None:  # what the model's request_id() and parameters() answer
                valid = replace(valid, context=context)
            priority, timeout_us = scheduling_parameters(request.parameters)
        except AgentError as exc:  # refused before it ran: no failure in the statistics (Triton)
            self._router.outcome(name, route, start, exc)
            if trace is not None:
                self._traces.stream_end(trace)
            raise
        self._router.started(route)
        responses = stream_responses(
            route.served,
            route.loaded,
            valid,
            request.id,
            priority=priority,
            timeout_us=timeout_us,
            start_ns=start,
            sequence=route.sequence,
        )
        failed: AgentError | None = None  # the request's first error, for the canary
        try:
            async for item in responses:
                if isinstance(item.error, ModelInstanceFailedError):
                    self._router.instance_failed(route, item.error)
                failed = failed or item.error
                if item.final:  # judged once complete (a client that left is not judged)
                    self._router.outcome(name, route, start, failed)
                if trace is not None and (item.response is not None or item.error is not None):
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                yield item
        except AgentError as exc:
            if isinstance(exc, ModelInstanceFailedError):
                self._router.instance_failed(route, exc)
            self._router.outcome(name, route, start, exc)
            raise
        finally:
            await responses.aclose()
            if trace is not None:
                self._traces.stream_end(trace)
