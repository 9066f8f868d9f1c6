"""Triton's trace extension: sampled per-request timestamps, written as Triton's trace JSON.

Settings are Triton's (`GET/POST /v2[/models/M]/trace/setting`, gRPC `TraceSetting`), every value
a string as Triton answers them: `trace_level` (a list: `["OFF"]` or `["TIMESTAMPS"]`),
`trace_rate` (one request in this many is traced), `trace_count` (traces left to take, `-1`: no
limit), `log_frequency` (write the file every this many traces, as `<trace_file>.<n>`; `0`: once,
to `<trace_file>`, when the agent stops), `trace_file` (set at start with `--trace-file`; not
over the network, as in Triton) and `trace_mode` (`triton`, or `opentelemetry`: set at start with
`--trace-mode`, not over the network). A model's settings are the global ones with the keys set
for that model on top.

In `opentelemetry` mode a finished trace goes to an exporter (`agent.serving.trace_otlp`: spans
over OTLP/HTTP) instead of the file; `log_frequency` and `trace_file` then play no part.

A trace is one request: a first entry with `id`, `model_name`, `model_version` (and
`request_id`), then one entry per timestamp, `{"id": N, "timestamps": [{"name": ..., "ns": ...}]}`,
in nanoseconds of a monotonic clock: `HTTP_RECV_START`/`HTTP_RECV_END` or `GRPC_WAITREAD_END`,
`REQUEST_START`, `QUEUE_START`, `COMPUTE_START`, `COMPUTE_INPUT_END`, `COMPUTE_OUTPUT_START`,
`COMPUTE_END`, `REQUEST_END`, `HTTP_SEND_START`/`HTTP_SEND_END` or
`GRPC_SEND_START`/`GRPC_SEND_END`.
With tracing off the transports and the data plane test one boolean (`Tracer.active`).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from agent.errors import InvalidInputError

logger = logging.getLogger(__name__)

KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
LEVELS = ("OFF", "TIMESTAMPS")
MODES = ("triton", "opentelemetry")
PROPAGATED = ("traceparent", "tracestate")  # W3C trace context headers / gRPC metadata keys
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """One set of trace settings (the global one, or a model's effective one)."""

    level: str = "OFF"  # OFF or TIMESTAMPS
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0


@dataclass(slots=True)
class Trace:
    """The timestamps of one sampled request."""

    id: int
    model_name: str
    request_id: str = ""
    model_version: int = 0
    stamps: list[tuple[str, int]] = field(default_factory=list)
    carrier: dict[str, str] = field(default_factory=dict)  # the client's W3C trace context

    def propagate(self, headers: Mapping[str, str]) -> None:
        """Keep the request's `traceparent` / `tracestate` (OpenTelemetry mode: the spans join
        the client's trace)."""
        self.carrier = {key: headers[key] for key in PROPAGATED if headers.get(key)}

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.perf_counter_ns() if ns is None else ns))

    def executed(
        self, queue_start_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """The scheduler's stages, from where the request was queued and the measured spans."""
        compute_start = queue_start_ns + queue_ns
        self.stamp("QUEUE_START", queue_start_ns)
        self.stamp("COMPUTE_START", compute_start)
        self.stamp("COMPUTE_INPUT_END", compute_start + input_ns)
        self.stamp("COMPUTE_OUTPUT_START", compute_start + input_ns + infer_ns)
        self.stamp("COMPUTE_END", compute_start + input_ns + infer_ns + output_ns)

    def entries(self) -> list[dict[str, Any]]:
        """Triton's trace JSON entries for this request."""
        head: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": self.model_version,
        }
        if self.request_id:
            head["request_id"] = self.request_id
        return [head] + [
            {"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self.stamps
        ]


class TraceExporter(Protocol):
    """Where finished traces go in `opentelemetry` mode."""

    def export(self, trace: Trace) -> None: ...

    def shutdown(self) -> None: ...


class _Sampler:
    """Rate and count bookkeeping of one owner of settings (global, or one model's)."""

    def __init__(self) -> None:
        self.seen = 0


class Tracer:
    """The live trace settings, the sampling, and the trace file."""

    def __init__(
        self,
        trace_file: str = "",
        initial: TraceConfig | None = None,
        *,
        mode: str = "triton",
        exporter: TraceExporter | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown trace mode {mode!r}, expected one of: {', '.join(MODES)}")
        self.trace_file = trace_file
        self.mode = mode
        self.exporter = exporter if mode == "opentelemetry" else None
        self._initial = initial or TraceConfig()
        self._global = self._initial
        self._models: dict[str, dict[str, Any]] = {}  # model -> the keys set for it
        self._samplers: dict[str | None, _Sampler] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: list[Trace] = []
        self._file_index = 0
        self.active = False
        self._recompute()

    # -- settings ---------------------------------------------------------------------------

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The settings in force (a model's: global with its own keys on top), as Triton."""
        config = self._effective(model)
        return {
            "trace_level": [config.level],
            "trace_rate": str(config.rate),
            "trace_count": str(config.count),
            "log_frequency": str(config.log_frequency),
            "trace_file": self.trace_file,
            "trace_mode": self.mode,
        }

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change the global settings or one model's; every setting in force after.

        A value of None clears a key (a model's falls back to the global one; a global one goes
        back to its value at start). A model's request with no settings at all drops every key
        set for it. Everything is checked before anything changes.

        Raises:
            InvalidInputError: an unknown key, a value Triton would refuse, `trace_file` or
                `trace_mode` (fixed at start).
        """
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in KEYS:
                raise InvalidInputError(
                    f"unknown trace setting '{key}', expected one of: {', '.join(KEYS)}"
                )
            if key == "trace_file":
                raise InvalidInputError(
                    "trace file location can not be updated through network protocol"
                )
            if key == "trace_mode":
                raise InvalidInputError("trace mode can not be updated through network protocol")
            parsed[_FIELD[key]] = None if value is None else _parse(key, value)
        with self._lock:
            if model is None:
                self._global = replace(
                    self._global,
                    **{k: getattr(self._initial, k) if v is None else v for k, v in parsed.items()},
                )
                self._samplers.pop(None, None)
            elif not changes:
                self._models.pop(model, None)
                self._samplers.pop(model, None)
            else:
                own = self._models.setdefault(model, {})
                for k, v in parsed.items():
                    if v is None:
                        own.pop(k, None)
                    else:
                        own[k] = v
                self._samplers.pop(model, None)
            self._recompute()
        return self.settings(model)

    def _effective(self, model: str | None) -> TraceConfig:
        own = self._models.get(model) if model is not None else None
        return replace(self._global, **own) if own else self._global

    def _recompute(self) -> None:
        configs = [self._global, *(self._effective(m) for m in self._models)]
        self.active = self._has_output() and any(
            c.level == "TIMESTAMPS" and c.count != 0 for c in configs
        )

    def _has_output(self) -> bool:
        if self.mode == "opentelemetry":
            return self.exporter is not None
        return bool(self.trace_file)

    # -- tracing ----------------------------------------------------------------------------

    def start(self, model: str, request_id: str = "") -> Trace | None:
        """A new trace for this request when its model's settings sample it, else None."""
        with self._lock:
            owner = model if model in self._models else None
            config = self._effective(model)
            if config.level != "TIMESTAMPS" or config.count == 0:
                return None
            sampler = self._samplers.setdefault(owner, _Sampler())
            sampler.seen += 1
            if sampler.seen % config.rate:
                return None
            if config.count > 0:
                self._take_one(owner, config.count - 1)
            return Trace(next(self._ids), model, request_id)

    def _take_one(self, owner: str | None, left: int) -> None:
        if owner is not None and "count" in self._models[owner]:
            self._models[owner]["count"] = left
        else:
            self._global = replace(self._global, count=left)
        if left == 0:
            self._recompute()

    def finish(self, trace: Trace, model: str | None = None) -> None:
        """Keep a finished trace; write the file when `log_frequency` traces are waiting (in
        `opentelemetry` mode: hand it to the exporter)."""
        if self.mode == "opentelemetry":
            if self.exporter is not None:
                self.exporter.export(trace)
            return
        frequency = self._effective(model or trace.model_name).log_frequency
        with self._lock:
            self._pending.append(trace)
            if frequency == 0 or len(self._pending) < frequency:
                return
            batch, self._pending = self._pending, []
            path = f"{self.trace_file}.{self._file_index}"
            self._file_index += 1
        _write(path, batch)

    def flush(self) -> None:
        """Write the traces still waiting (at stop): to `<trace_file>`, or to the next indexed
        file when the global `log_frequency` is set."""
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch or not self.trace_file:
                return
            if self._global.log_frequency > 0:
                path = f"{self.trace_file}.{self._file_index}"
                self._file_index += 1
            else:
                path = self.trace_file
        _write(path, batch)

    def close(self) -> None:
        """At stop: write the waiting traces, and flush and shut down the exporter."""
        self.flush()
        if self.exporter is not None:
            self.exporter.shutdown()


_FIELD = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


def _write(path: str, traces: list[Trace]) -> None:
    entries = [entry for trace in traces for entry in trace.entries()]
    try:
        Path(path).write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        logger.error("cannot write the trace file %s: %s", path, exc)


def _parse(key: str, value: Any) -> Any:
    if key == "trace_level":
        return _parse_level(value)
    if not isinstance(value, str):
        raise InvalidInputError("attempt to access JSON non-string as string")
    try:
        number = int(value)
    except ValueError:
        raise InvalidInputError(f"Unable to parse '{key}', got: {value}") from None
    if key == "trace_count":
        if number < -1:
            raise InvalidInputError(
                f"Unable to parse 'trace_count'. Expecting value >= -1, got:{value}"
            )
        if number > _INT32_MAX:
            raise InvalidInputError(
                f"Unable to parse 'trace_count', value is out of range [ -1, {_INT32_MAX} ], "
                f"got: {value}"
            )
        return number
    low = 1 if key == "trace_rate" else 0
    if not low <= number <= _UINT32_MAX:
        raise InvalidInputError(
            f"Unable to parse '{key}', value is out of range [ {low}, {_UINT32_MAX} ], got: {value}"
        )
    return number


def _parse_level(value: Any) -> str:
    if not isinstance(value, list):
        raise InvalidInputError("attempt to access JSON non-array as array")
    levels = set()
    for item in value:
        if not isinstance(item, str):
            raise InvalidInputError("attempt to access JSON non-string as string")
        if item == "TENSORS":
            raise InvalidInputError("trace level 'TENSORS' is not supported, only TIMESTAMPS")
        if item not in LEVELS:
            raise InvalidInputError(
                f"unknown trace level '{item}', expected one of: {', '.join(LEVELS)}"
            )
        levels.add(item)
    if "OFF" in levels and len(value) > 1:
        raise InvalidInputError("Expect only one trace level 'OFF' is specified")
    if not levels:
        raise InvalidInputError("trace_level must name at least one level")
    return "TIMESTAMPS" if "TIMESTAMPS" in levels else "OFF"
