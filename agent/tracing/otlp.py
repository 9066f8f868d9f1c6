"""Triton's OpenTelemetry trace mode: each traced request exported as spans over OTLP/HTTP.

Triton's span layout, from the timestamps `Trace` collects:

    InferRequest          the transport's events: HTTP_RECV_START, HTTP_RECV_END (gRPC:
    │                     GRPC_WAITREAD_END), HTTP_SEND_START, HTTP_SEND_END (GRPC_SEND_*)
    └── <model name>      REQUEST_START, QUEUE_START, REQUEST_END; attributes
        │                 triton.model_name, triton.model_version, triton.trace_id,
        │                 triton.trace_parent_id (and triton.request_id when the request has one)
        └── compute       COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END

A traced ensemble's steps and the BLS requests a traced Python model makes with
`trace=request.trace()` are child traces: their model spans (each with its compute span) are
children of the parent's model span, with `triton.trace_parent_id` the parent's trace id, as in
Triton.

Every span is of kind SERVER and starts and ends at its first and last event. A request that
carries a W3C `traceparent` (HTTP header or gRPC metadata) has its InferRequest span join that
trace, as the client's span's child (Triton's context propagation). The tracer's
timestamps come from a monotonic clock; as in Triton they are moved onto the wall clock by one
offset taken when the exporter starts. Spans go through the SDK's `BatchSpanProcessor` to the
OTLP/HTTP exporter (`opentelemetry-sdk`, `opentelemetry-exporter-otlp-proto-http`), imported
only when this mode is configured, so a serving agent without it never loads them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agent.tracing.tracer import Trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:4318/v1/traces"  # Triton's default (`opentelemetry,url=`)
DEFAULT_RESOURCE = {"service.name": "triton-inference-server"}  # Triton's default resource
# One export's bound unless OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT says otherwise: the flush at stop
# waits for it after the listeners' drain, within systemd's stop timeout.
EXPORT_TIMEOUT_S = 5.0
ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
_REQUEST_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
_COMPUTE_EVENTS = frozenset(
    {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}
)


def parse_resource(pairs: Iterable[str]) -> dict[str, str]:
    """Triton's `resource=<key>=<value>` settings as attributes, on top of its default.

    Raises:
        ValueError: a pair without `=` or with an empty key.
    """
    attributes = dict(DEFAULT_RESOURCE)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected <key>=<value>, got {pair!r}")
        attributes[key.strip()] = value.strip()
    return attributes


def _timeout_from_environment() -> bool:
    return any(
        os.environ.get(key)
        for key in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    )


class OtlpExporter:
    """An SDK tracer provider of its own (the global one is left alone) exporting to `url`."""

    def __init__(self, url: str = DEFAULT_URL, resource: Mapping[str, str] | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.trace import SpanKind  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        self.url = url
        self._kind = SpanKind.SERVER
        self._propagator = TraceContextTextMapPropagator()
        self._provider: TracerProvider = TracerProvider(
            resource=Resource.create(dict(resource or DEFAULT_RESOURCE))
        )
        timeout = None if _timeout_from_environment() else EXPORT_TIMEOUT_S
        exporter = OTLPSpanExporter(endpoint=url, timeout=timeout)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("edge-agent")
        # Monotonic (perf_counter) nanoseconds + offset = wall-clock nanoseconds.
        self._offset = time.time_ns() - time.perf_counter_ns()
        self._closed = False

    def export(self, trace: Trace) -> None:
        """Queue one finished request's spans, its children's under its model span (exported
        in batches, in the background)."""
        if self._closed:
            return
        from opentelemetry import trace as otel  # noqa: PLC0415

        if trace.parent is not None:  # a child that outlived its parent: under its model span
            if trace.parent.span_context is not None:
                self._model_spans(trace, trace.parent.span_context)
            return
        if not trace.stamps:
            return
        stamps = self._wall(trace.stamps)
        root_events = [s for s in stamps if s[0] not in _REQUEST_EVENTS | _COMPUTE_EVENTS]
        parent = self._propagator.extract(trace.carrier) if trace.carrier else None
        root = self._span(ROOT_SPAN, stamps, root_events, parent, {})
        self._model_spans(trace, otel.set_span_in_context(root))
        root.end(end_time=max(ns for _, ns in stamps))

    def _wall(self, stamps: list[tuple[str, int]]) -> list[tuple[str, int]]:
        return [(name, ns + self._offset) for name, ns in stamps]

    def _model_spans(self, trace: Trace, context: Any) -> None:
        """The model span (and its compute span) of `trace`, child of `context`; then, under
        the model span, those of the children it spawned (ensemble steps, BLS requests)."""
        from opentelemetry import trace as otel  # noqa: PLC0415

        stamps = self._wall(trace.stamps)
        request_events = [s for s in stamps if s[0] in _REQUEST_EVENTS]
        compute_events = [s for s in stamps if s[0] in _COMPUTE_EVENTS]
        if not request_events:
            return
        attributes: dict[str, Any] = {
            "triton.model_name": trace.model_name,
            "triton.model_version": trace.model_version,
            "triton.trace_id": trace.id,
            "triton.trace_parent_id": trace.parent_id,
        }
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        request = self._span(trace.model_name, request_events, request_events, context, attributes)
        trace.span_context = otel.set_span_in_context(request)
        if compute_events:
            compute = self._span(
                COMPUTE_SPAN, compute_events, compute_events, trace.span_context, {}
            )
            compute.end(end_time=max(ns for _, ns in compute_events))
        for child in trace.children:
            self._model_spans(child, trace.span_context)
        request.end(end_time=max(ns for _, ns in request_events))

    def _span(
        self,
        name: str,
        bounds: list[tuple[str, int]],
        events: list[tuple[str, int]],
        context: Any,
        attributes: Mapping[str, Any],
    ) -> Any:
        span = self._tracer.start_span(
            name,
            context=context,
            kind=self._kind,
            attributes=attributes,
            start_time=min(ns for _, ns in bounds),
        )
        for event, ns in sorted(events, key=lambda s: s[1]):
            span.add_event(event, timestamp=ns)
        return span

    def shutdown(self) -> None:
        """Export what is queued and stop (at agent stop); later traces are dropped."""
        if self._closed:
            return
        self._closed = True
        try:
            self._provider.shutdown()
        except Exception:  # the collector gone at shutdown must not fail the stop
            logger.exception("OpenTelemetry trace exporter shutdown failed")
