"""The prologue of every inference on the data plane, written once for the unary path
(`DataPlane.infer`) and the streamed one (`agent.serving.streamed_inference`).

`RequestRouter.route` picks the served version a request goes to:

1. a continuing request of a live sequence goes where its sequence started
   (`agent.serving.sequence_routes`), even while that build drains after a hot swap;
2. any other request waits while its model is swapped drain-first (bounded: 503 past the limit);
3. a request that names no version goes where a running canary or a pin sends it;
4. the registry resolves the model and version, or raises 404 (unknown) / 503 (not READY).

`RequestRouter.admit` then checks the request against the version's signature (Triton's words,
opened with the request's id) and records its input tensors when it is traced. The router also
remembers where a sequence started, tells the canary how a request it routed went, and takes a
version whose instance failed out of service (unless its backend restarts its instances).

Invariant (`agent.models.control`): from `resolve` to the scheduler's queue there is no
suspension. `route` may wait only before it resolves, and the callers go on to `submit` without
an await in between, so no request reaches a version after routing switched away from it.

Cost: `route` is the request's one coroutine before its scheduler (the swap gate is checked
without one, so it replaces the coroutine of `wait_if_swapping`), and `Route` its one object;
everything else is the work the paths did inline.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.canary.control import CanaryManager
from agent.errors import (
    AgentError,
    InvalidInputError,
    ModelInstanceFailedError,
    UnknownTensorError,
)
from agent.models.control import ModelManager
from agent.models.registry import ModelRegistry
from agent.models.served import LoadedVersion, ServedModel
from agent.scheduling.sequence_policy import SequenceRequest, sequence_parameters
from agent.serving.request_traces import RequestTraces
from agent.serving.sequence_routes import SequenceRoutes
from agent.tensors.request import InferRequest
from agent.tensors.signature import ValidatedRequest
from agent.tracing.tracer import Trace

__all__ = ["RequestRouter", "Route"]


@dataclass(slots=True)  # not frozen: its __init__ would set each field through object.__setattr__
class Route:
    """Where one request goes: the served model, its version, and how it got there (read-only
    by convention: one is made per request, and a frozen one costs ~0.5 µs more to make)."""

    served: ServedModel
    number: int  # the version
    loaded: LoadedVersion  # served.versions[number]
    canary: int | None  # the version a canary (or pin) picked; None: not routed by one
    sequence: SequenceRequest | None  # the request's sequence id and flags, if any


class RequestRouter:
    """Routes and admits the data plane's requests (see the module docstring)."""

    def __init__(
        self,
        registry: ModelRegistry,
        manager: ModelManager,
        canary: CanaryManager,
        traces: RequestTraces,
    ) -> None:
        self._registry = registry
        self.manager = manager  # replaceable: the daemon wires one that reports its events
        self._canary = canary
        self._traces = traces
        self._sequences = SequenceRoutes()  # live sequences stay on the version they started on

    async def route(self, name: str, version: str | None, parameters: Mapping[str, Any]) -> Route:
        """The version a request to `name` (`version`: as addressed, None for any) goes to.

        Raises:
            OverloadedError: too many requests wait for the model's drain-first swap.
            InvalidInputError: bad sequence parameters, or a version that is not a number.
            ModelNotFoundError, ModelNotReadyError: the model or version cannot serve.
        """
        sequence = sequence_parameters(parameters) if parameters else None  # most have none
        owner = None if version or sequence is None else self._sequences.find(name, sequence)
        # A live sequence's old build is draining: its requests must not wait for the swap.
        if owner is None and self.manager.swapping(name):
            await self.manager.wait_if_swapping(name)
        routed = None if version or owner else self._canary.route(name)  # unversioned only
        served, number = owner or self._registry.resolve(name, str(routed) if routed else version)
        return Route(served, number, served.versions[number], routed, sequence)

    def admit(self, route: Route, request: InferRequest, trace: Trace | None) -> ValidatedRequest:
        """The request checked against the routed version's signature (names, datatypes,
        shapes, batch size; reshapes applied), its inputs recorded when it is traced.

        Raises:
            InvalidInputError: the request does not match the model (Triton's words, opened
                with the request's id for its inputs).
        """
        signature = route.served.signature
        if request.outputs is not None:  # Triton checks these first, and names no request id
            signature.output_names(request)
        try:
            valid = signature.validate(request)
        except UnknownTensorError:
            raise  # Triton's words, without the request's id
        except InvalidInputError as exc:  # Triton's words open with the request's id
            tag = request.id or "<id_unknown>"
            raise InvalidInputError(f"[request id: {tag}] {exc.message}") from None
        if trace is not None:
            valid = self._traces.inputs(trace, request, valid, signature)
        return valid

    def started(self, route: Route) -> None:
        """The request is about to be queued: remember where its sequence started (or forget
        it when it ends), when its scheduler keeps sequences."""
        if route.sequence is not None and route.loaded.scheduler.sequences is not None:
            self._sequences.started(route.served.name, route.sequence, route.served, route.number)

    def outcome(self, name: str, route: Route, start_ns: int, error: AgentError | None) -> None:
        """Tell the canary how a request it routed went (latency from arrival to answer)."""
        if route.canary is not None:
            latency_us = (time.perf_counter_ns() - start_ns) // 1000
            self._canary.record(name, route.canary, latency_us, error)

    def instance_failed(self, route: Route, error: ModelInstanceFailedError) -> None:
        """An instance of the routed version hung or died: take the version out of service,
        unless its backend restarts its instances itself (`ReportsHealth`: the version is then
        not ready until one serves again, and gives itself up past its restart limit)."""
        if route.loaded.monitor is not None:
            return
        self._registry.mark_failed(
            route.served.name, route.number, error.message, loaded=route.loaded
        )
