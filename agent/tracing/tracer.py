"""Triton's trace extension: sampled requests' timestamps and tensors, as Triton's trace JSON.

Settings are Triton's (`GET/POST /v2[/models/M]/trace/setting`, gRPC `TraceSetting`), every value
a string as Triton answers them: `trace_level` (a list: `["OFF"]`, or one or both of
`TIMESTAMPS` and `TENSORS`), `trace_rate` (one request in this many is traced), `trace_count`
(traces left to take, `-1`: no limit), `log_frequency` (write every this many traces, as
`<trace_file>.<n>`; `0`: to `<trace_file>` when the settings change or the agent stops; see
`agent.tracing.file`), `trace_file` (set at start with `--trace-file`; not over the
network, as in Triton) and `trace_mode` (`triton`, or `opentelemetry`: set at start with
`--trace-mode`, not over the network). A model's settings are the global ones with the keys set
for that model on top; as Triton's TraceSetting, the global settings and each model with keys
of its own sample, count and keep traces on their own (`_Owner`).

In `opentelemetry` mode a finished trace goes to an exporter (`agent.tracing.otlp`: spans
over OTLP/HTTP) instead of the file; `log_frequency` and `trace_file` then play no part.

A trace is one request: a first entry with `id`, `model_name`, `model_version` (and
`request_id`), then one entry per timestamp, `{"id": N, "timestamps": [{"name": ..., "ns": ...}]}`,
in nanoseconds of a monotonic clock: `HTTP_RECV_START`/`HTTP_RECV_END` or `GRPC_WAITREAD_END`,
`REQUEST_START`, `QUEUE_START`, `COMPUTE_START`, `COMPUTE_INPUT_END`, `COMPUTE_OUTPUT_START`,
`COMPUTE_END`, `REQUEST_END`, `HTTP_SEND_START`/`HTTP_SEND_END` or
`GRPC_SEND_START`/`GRPC_SEND_END`. At level `TENSORS` the request's tensors follow as entries
of their own (`agent.tracing.tensors`); in `opentelemetry` mode, as in Triton, tensors are
not traced.

Child traces: each step of a traced ensemble, and each BLS request a traced Python model makes
with `trace=request.trace()`, is a trace of its own with a new `id` and `parent_id` (the parent's
`id`) in its first entry, written with its parent's (as Triton, with the parent's file). A child
takes no sample: it is traced because its parent is, at its parent's levels.

With tracing off the transports test one boolean (`Tracer.active`) and the data plane one
attribute of the request (`parent_trace`, set only for a traced request's children).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from agent.errors import InvalidInputError
from agent.tracing.file import TraceFile
from agent.tracing.tensors import tensor_entry

KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
PROPAGATED = ("traceparent", "tracestate")  # W3C trace context headers / gRPC metadata keys
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """One set of trace settings (the global one, or a model's effective one)."""

    levels: tuple[str, ...] = ("OFF",)  # ("OFF",), or TIMESTAMPS and/or TENSORS
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0


@dataclass(slots=True)
class Trace:
    """The timestamps (and at level TENSORS the tensors) of one sampled request."""

    id: int
    model_name: str
    request_id: str = ""
    model_version: int = 0
    stamps: list[tuple[str, int]] = field(default_factory=list)
    carrier: dict[str, str] = field(default_factory=dict)  # the client's W3C trace context
    timestamps: bool = True  # level TIMESTAMPS
    tensors: bool = False  # level TENSORS
    parent: Trace | None = None  # the ensemble or Python model whose request spawned this one
    children: list[Trace] = field(default_factory=list)  # finished before this trace
    done: bool = False
    # (position among the stamps, activity, tensor): written in the order they happened
    tensor_records: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    span_context: Any = None  # opentelemetry mode: the model span's context, for late children
    owner: Any = None  # the settings that took it (the tracer's), where it is kept until written

    @property
    def parent_id(self) -> int:
        return self.parent.id if self.parent is not None else 0

    def propagate(self, headers: Mapping[str, str]) -> None:
        """Keep the request's `traceparent` / `tracestate` (OpenTelemetry mode: the spans join
        the client's trace)."""
        self.carrier = {key: headers[key] for key in PROPAGATED if headers.get(key)}

    def stamp(self, name: str, ns: int | None = None) -> None:
        if self.timestamps:
            self.stamps.append((name, time.perf_counter_ns() if ns is None else ns))

    def tensor(self, activity: str, name: str, datatype: str, data: np.ndarray) -> None:
        """One tensor entry (level TENSORS only: the caller checks `tensors`)."""
        self.tensor_records.append((len(self.stamps), activity, tensor_entry(name, datatype, data)))

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
        """Triton's trace JSON entries for this request, then its children's."""
        head: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": self.model_version,
        }
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent is not None:
            head["parent_id"] = self.parent.id
        out = [head]
        records = iter(self.tensor_records)
        record = next(records, None)
        for index, (name, ns) in enumerate(self.stamps):
            while record is not None and record[0] <= index:
                out.append({"id": self.id, "activity": record[1], "tensor": record[2]})
                record = next(records, None)
            out.append({"id": self.id, "timestamps": [{"name": name, "ns": ns}]})
        while record is not None:
            out.append({"id": self.id, "activity": record[1], "tensor": record[2]})
            record = next(records, None)
        for child in self.children:
            out += child.entries()
        return out


class TraceExporter(Protocol):
    """Where finished traces go in `opentelemetry` mode."""

    def export(self, trace: Trace) -> None: ...

    def shutdown(self) -> None: ...


class _Owner:
    """The settings in force for the global scope or one model, with their live state (Triton's
    TraceSetting): sampling, the traces left to take, and the finished traces not yet written.
    Changing the settings replaces it; the replaced one writes what it holds."""

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.left = config.count
        self.seen = 0
        self.taken = 0
        self.collected = 0
        self.pending: list[Trace] = []
        self.retired = False


_Write = tuple[list[Trace], bool]  # traces, to an indexed file


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
        self._file = TraceFile(trace_file)
        self._initial = initial or TraceConfig()
        self._global = self._initial
        self._models: dict[str, dict[str, Any]] = {}  # model -> the keys set for it
        self._owners: dict[str | None, _Owner] = {None: _Owner(self._global)}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.active = False
        self._recompute()

    # -- settings ---------------------------------------------------------------------------

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The settings in force (a model's: global with its own keys on top), as Triton."""
        owner = self._owner(model)
        config = owner.config
        return {
            "trace_level": list(config.levels),
            "trace_rate": str(config.rate),
            "trace_count": str(owner.left),
            "log_frequency": str(config.log_frequency),
            "trace_file": self.trace_file,
            "trace_mode": self.mode,
        }

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change the global settings or one model's; every setting in force after.

        A value of None clears a key (a model's falls back to the global one; a global one goes
        back to its value at start). A model's request with no settings at all drops every key
        set for it. A model's keys not set for it follow the global ones as they change. The
        settings replaced write the traces they hold, and sampling and `trace_count` start
        afresh from the new settings (a `trace_count` not given keeps what was left of it).
        Everything is checked before anything changes.

        Raises:
            InvalidInputError: an unknown key, a value Triton would refuse, `trace_file` or
                `trace_mode` (fixed at start), a level other than OFF in `triton` mode with
                no trace file (as Triton: the traces would go nowhere).
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
        levels = parsed.get("levels")
        # Nowhere to write traces to: Triton refuses the level rather than drop them.
        if levels not in (None, ("OFF",)) and self.mode == "triton" and not self.trace_file:
            raise InvalidInputError(
                "Attempting to set invalid trace setting :trace file name is not given"
            )
        writes: list[_Write] = []
        with self._lock:
            if model is None:
                self._global = replace(
                    self._global,
                    **{k: getattr(self._initial, k) if v is None else v for k, v in parsed.items()},
                )
                writes += self._renew(None)
                for name, own in self._models.items():
                    if len(own) < len(_FIELD):  # follows some global keys
                        writes += self._renew(name)
            else:
                own = self._models.setdefault(model, {})
                for k, v in parsed.items():
                    if v is None:
                        own.pop(k, None)
                    else:
                        own[k] = v
                if not changes or not own:
                    del self._models[model]
                    writes += self._retire(model)
                else:
                    writes += self._renew(model)
            self._recompute()
        self._save(writes)
        return self.settings(model)

    def _owner(self, model: str | None) -> _Owner:
        return self._owners.get(model) or self._owners[None]

    def _renew(self, key: str | None) -> list[_Write]:
        writes = self._retire(key)
        own = self._models.get(key) if key is not None else None
        self._owners[key] = _Owner(replace(self._global, **own) if own else self._global)
        return writes

    def _retire(self, key: str | None) -> list[_Write]:
        old = self._owners.pop(key, None)
        if old is None:
            return []
        old.retired = True
        batch, old.pending = old.pending, []
        return [(batch, old.config.log_frequency > 0)] if batch else []

    def _recompute(self) -> None:
        self.active = self._has_output() and any(
            o.config.levels != ("OFF",) and o.left != 0 for o in self._owners.values()
        )

    def _has_output(self) -> bool:
        if self.mode == "opentelemetry":
            return self.exporter is not None
        return bool(self.trace_file)

    # -- tracing ----------------------------------------------------------------------------

    def start(self, model: str, request_id: str = "") -> Trace | None:
        """A new trace for this request when its model's settings sample it, else None."""
        with self._lock:
            owner = self._owner(model)
            config = owner.config
            if config.levels == ("OFF",) or owner.left == 0:
                return None
            owner.seen += 1
            if owner.seen % config.rate:
                return None
            if owner.left > 0:
                self._take_one(model, owner)
            owner.taken += 1
            return Trace(
                next(self._ids),
                model,
                request_id,
                timestamps="TIMESTAMPS" in config.levels,
                # Triton's OpenTelemetry mode does not trace tensors.
                tensors="TENSORS" in config.levels and self.mode == "triton",
                owner=owner,
            )

    def spawn(self, parent: Trace, model: str, request_id: str = "") -> Trace:
        """The child trace of an ensemble step or a BLS request made by `parent`'s request."""
        with self._lock:
            trace_id = next(self._ids)
        return Trace(
            trace_id,
            model,
            request_id,
            timestamps=parent.timestamps,
            tensors=parent.tensors,
            parent=parent,
            owner=parent.owner,
        )

    def _take_one(self, model: str, owner: _Owner) -> None:
        owner.left -= 1
        # The keys it was set from show the count left, as Triton's settings answer it.
        if owner is self._owners[None]:
            self._global = replace(self._global, count=owner.left)
        elif "count" in self._models.get(model, {}):
            self._models[model]["count"] = owner.left
        if owner.left == 0:
            self._recompute()

    def finish(self, trace: Trace, model: str | None = None) -> None:
        """Keep a finished trace; write it when its settings say so (in `opentelemetry` mode:
        hand it to the exporter).

        A child finished while its parent runs waits to be written (exported) with it; one that
        outlives its parent (a BLS call its model left running) goes out on its own.
        """
        parent = trace.parent
        if parent is not None and not parent.done:
            parent.children.append(trace)
            return
        trace.done = True
        if self.mode == "opentelemetry":
            if self.exporter is not None:
                self.exporter.export(trace)
            return
        owner = trace.owner if isinstance(trace.owner, _Owner) else self._owner(model)
        config = owner.config
        with self._lock:
            owner.pending.append(trace)
            if parent is None:
                owner.collected += 1
            if owner.retired:
                write = (owner.pending, config.log_frequency > 0)
            elif (config.log_frequency and len(owner.pending) >= config.log_frequency) or (
                owner.left == 0 and owner.collected >= owner.taken
            ):
                write = (owner.pending, True)
            else:
                return
            owner.pending = []
        self._save([write])

    def flush(self) -> None:
        """Write the traces still waiting (at stop): to `<trace_file>`, or to the next indexed
        file when their settings' `log_frequency` is set."""
        with self._lock:
            writes: list[_Write] = []
            for owner in self._owners.values():
                if owner.pending:
                    writes.append((owner.pending, owner.config.log_frequency > 0))
                    owner.pending = []
        self._save(writes)

    def _save(self, writes: list[_Write]) -> None:
        for traces, indexed in writes:
            self._file.save([e for trace in traces for e in trace.entries()], indexed=indexed)

    def close(self) -> None:
        """At stop: write the waiting traces, and flush and shut down the exporter."""
        self.flush()
        if self.exporter is not None:
            self.exporter.shutdown()


_FIELD = {
    "trace_level": "levels",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


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


def _parse_level(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidInputError("attempt to access JSON non-array as array")
    levels = set()
    for item in value:
        if not isinstance(item, str):
            raise InvalidInputError("attempt to access JSON non-string as string")
        if item not in LEVELS:
            raise InvalidInputError(
                f"unknown trace level '{item}', expected one of: {', '.join(LEVELS)}"
            )
        levels.add(item)
    if "OFF" in levels and len(value) > 1:
        raise InvalidInputError("Expect only one trace level 'OFF' is specified")
    if not levels:
        raise InvalidInputError("trace_level must name at least one level")
    return tuple(level for level in LEVELS if level in levels)
