"""Triton's trace extension: trace settings, sampled request timelines, the trace file and the
OpenTelemetry exporter."""
