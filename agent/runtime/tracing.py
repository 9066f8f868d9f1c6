"""The agent's request tracer, as `[log]` configures it: a trace file, or OpenTelemetry spans.

The opentelemetry packages are imported only in opentelemetry mode (memory on a small device).
"""

from __future__ import annotations

import logging

from agent.config.choices import TraceMode
from agent.config.schema import AgentConfig
from agent.tracing.tracer import Tracer

__all__ = ["build_tracer"]

logger = logging.getLogger(__name__)


def build_tracer(config: AgentConfig) -> Tracer:
    """The trace settings and output: the trace file, or in opentelemetry mode an OTLP/HTTP
    exporter (the opentelemetry packages are imported only then)."""
    log = config.log
    if log.trace_mode is not TraceMode.OPENTELEMETRY:
        return Tracer(str(log.trace_file or ""))
    from agent.tracing.otlp import (  # noqa: PLC0415 - opentelemetry only when configured
        DEFAULT_URL,
        OtlpExporter,
        parse_resource,
    )

    url = log.trace_otlp_url or DEFAULT_URL
    exporter = OtlpExporter(url, parse_resource(log.trace_otlp_resource))
    logger.info("traces: OpenTelemetry spans to %s", url)
    return Tracer(mode="opentelemetry", exporter=exporter)
