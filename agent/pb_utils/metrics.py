"""Custom metrics of Python models: Triton's `pb_utils.MetricFamily` and `pb_utils.Metric`.

A model creates metric families and labelled metrics in its worker process::

    family = pb_utils.MetricFamily(name="requests_total_ns", description="...",
                                   kind=pb_utils.MetricFamily.COUNTER)  # GAUGE, HISTOGRAM
    metric = family.Metric(labels={"model": "m"})  # buckets=[...] for HISTOGRAM
    metric.increment(5)  # counter, gauge
    metric.set(1.5)      # gauge
    metric.observe(0.2)  # histogram
    metric.value()       # counter, gauge: the current value

The worker holds its own share of each metric; the agent holds the total over every instance
of every model (one Prometheus series, as Triton's one metric in the server). `value()` answers
that total: during `initialize` and `execute` it asks the agent (a METRIC_VALUE message, after
the pending updates), elsewhere (a thread of the model's own between calls) it answers this
worker's share. Updates are coalesced per metric (a counter's increments add up, a gauge keeps its
last `set` plus the increments after it, a histogram its bucket counts and sum) and
`take_updates()` hands them over; the worker sends them to the agent right before each message
it sends (so before the response of the `execute` that made them), as one METRICS message. A hot
loop of increments costs dictionary updates, not pipe writes.

Validation and messages follow Triton (core `metric_family.cc`, python_backend `metric.cc`);
errors raise `TritonModelException`. A family name is one family per worker: the same name again
with the same kind is the same family (the first description stays), with another kind an
error. Two models that declare one name with different kinds conflict in the agent, which keeps
the first and logs the second.

This module is imported by `agent.pb_utils` (which re-exports its public names) and needs only
the standard library (and pb_utils' exception, from `agent.pb_utils.errors`).
"""

from __future__ import annotations

import enum
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.pb_utils.errors import TritonModelException

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricKind(enum.IntEnum):
    """Kinds of `MetricFamily` (Triton's `pb_utils.MetricFamily.COUNTER` ...)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_TRITON_KIND = {k: f"TRITONSERVER_METRIC_KIND_{k.name}" for k in MetricKind}


@dataclass(slots=True)
class _Series:
    """One labelled metric's value here, and what the agent has not been told yet."""

    family: str
    labels: dict[str, str]
    kind: MetricKind
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # histogram, per bucket then +Inf
    total: float = 0.0  # histogram sum
    # Pending for the agent: "inc" (delta), "set" (absolute), histogram counts and sum.
    pending: dict[str, Any] | None = None


class _Store:
    """This process's families and metrics (Triton keeps them per process too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, tuple[MetricKind, str]] = {}
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        self.new_families: list[dict[str, Any]] = []
        self.dirty: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}


_store = _Store()


# Asks the agent for a metric's total over every instance (family, labels) → value, or None
# when it cannot answer now; set by the worker while the agent listens.
TotalSource = Callable[[str, dict[str, str]], "float | None"]
_total_source: TotalSource | None = None


def set_total_source(source: TotalSource | None) -> None:
    """Let `Metric.value()` answer the agent's total (the worker sets it around its calls)."""
    global _total_source  # noqa: PLW0603 - one model per worker process
    _total_source = source


def take_updates() -> dict[str, Any] | None:
    """The families and metric changes since the last call (a METRICS message's meta), or None.

    meta {"families": [{"name", "description", "kind"}],
          "metrics": [{"family", "labels", "buckets"?, "inc"? | "set"?, "counts"?, "sum"?}]}
    """
    if not _store.new_families and not _store.dirty:
        return None  # the usual case, before every message: no lock (a change racing this one
        # goes with the next message, as it would have after the lock)
    with _store.lock:
        if not _store.new_families and not _store.dirty:
            return None
        metrics = []
        for series in _store.dirty.values():
            item: dict[str, Any] = {"family": series.family, "labels": series.labels}
            if series.kind is MetricKind.HISTOGRAM:
                item["buckets"] = list(series.buckets)
            item.update(series.pending or {})
            series.pending = None
            metrics.append(item)
        meta = {"families": _store.new_families, "metrics": metrics}
        _store.new_families = []
        _store.dirty = {}
        return meta


def _raise(prefix: str, text: str) -> Any:
    raise TritonModelException(f"{prefix}: {text}")


class MetricFamily:
    """A named family of metrics of one kind (Triton's `pb_utils.MetricFamily`)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        where = "Error when creating MetricFamily"
        if not isinstance(name, str) or not _NAME.match(name):
            _raise(where, f"Invalid metric name '{name}'")
        if not isinstance(description, str):
            _raise(where, "description must be a string")
        try:
            kind = MetricKind(kind)
        except ValueError:
            _raise(where, "Unsupported kind passed to MetricFamily constructor.")
        with _store.lock:
            known = _store.families.get(name)
            if known is None:
                _store.families[name] = (kind, description)
                _store.new_families.append(
                    {"name": name, "description": description, "kind": kind.name}
                )
            elif known[0] is not kind:
                _raise(
                    where,
                    f"Family name '{name}' already exists with a different kind "
                    f"({known[0].name}, not {kind.name})",
                )
            else:
                description = known[1]  # as Triton: the first description stays
        self._name = name
        self._description = description
        self._kind = kind

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        """A metric of this family with these labels (the same labels: the same metric)."""
        return Metric(self, labels, buckets)


class Metric:
    """One labelled metric of a `MetricFamily` (Triton's `pb_utils.Metric`)."""

    def __init__(
        self,
        family: MetricFamily,
        labels: Mapping[str, str] | None = None,
        buckets: Sequence[float] | None = None,
    ) -> None:
        where = "Error when creating Metric"
        labels = {} if labels is None else labels
        if not isinstance(labels, Mapping):
            _raise(where, "labels must be a dict of str to str")
        for label, text in labels.items():
            if not isinstance(text, str):
                _raise(
                    where,
                    f"Parameter [{label}] must have a type of TRITONSERVER_PARAMETER_STRING to be "
                    "added as a label.",
                )
            if not isinstance(label, str) or not _LABEL.match(label) or label.startswith("__"):
                _raise(where, f"Invalid label name '{label}'")
        kind = family._kind
        bounds: tuple[float, ...] = ()
        if kind is MetricKind.HISTOGRAM:
            if buckets is None:
                _raise(where, "Bucket boundaries not found in Metric args.")
            assert buckets is not None
            try:
                bounds = tuple(float(b) for b in buckets)
            except (TypeError, ValueError):
                _raise(where, "buckets must be a list of numbers")
            if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)) or any(
                math.isnan(b) for b in bounds
            ):
                _raise(where, "Bucket Boundaries must be strictly sorted")
        elif buckets is not None:
            _raise(where, f"Unexpected args found in {kind.name.lower()} Metric constructor.")
        self._kind = kind
        key = (family._name, tuple(sorted(labels.items())))
        with _store.lock:
            series = _store.series.get(key)
            if series is None:  # new: the agent shows it at 0, as Triton does
                series = _Series(family._name, dict(labels), kind, bounds)
                series.counts = [0] * (len(bounds) + 1) if kind is MetricKind.HISTOGRAM else []
                _store.series[key] = series
                _store.dirty[key] = series
                series.pending = {}
        self._series = series
        self._key = key

    def increment(self, value: float) -> None:
        """Add `value` (counter: non-negative; gauge: any sign)."""
        where = "Failed to increment metric value"
        value = _number(where, value)
        if self._kind is MetricKind.HISTOGRAM:
            _raise(where, "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        if self._kind is MetricKind.COUNTER and value < 0.0:
            _raise(
                where,
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values.",
            )
        with _store.lock:
            series = self._series
            series.value += value
            pending = self._pending()
            if "set" in pending:
                pending["set"] = series.value
            else:
                pending["inc"] = pending.get("inc", 0.0) + value

    def set(self, value: float) -> None:
        """Set a gauge to `value`."""
        where = "Failed to set metric value"
        value = _number(where, value)
        if self._kind is not MetricKind.GAUGE:
            _raise(where, f"{_TRITON_KIND[self._kind]} does not support Set")
        with _store.lock:
            self._series.value = value
            pending = self._pending()
            pending.pop("inc", None)
            pending["set"] = value

    def observe(self, value: float) -> None:
        """Record one observation in a histogram."""
        where = "Failed to observe metric value"
        value = _number(where, value)
        if self._kind is not MetricKind.HISTOGRAM:
            _raise(where, f"{_TRITON_KIND[self._kind]} does not support Observe")
        series = self._series
        index = next((i for i, b in enumerate(series.buckets) if value <= b), len(series.buckets))
        with _store.lock:
            series.counts[index] += 1
            series.total += value
            pending = self._pending()
            counts = pending.setdefault("counts", [0] * len(series.counts))
            counts[index] += 1
            pending["sum"] = pending.get("sum", 0.0) + value

    def value(self) -> float:
        """The current value of a counter or gauge."""
        if self._kind is MetricKind.HISTOGRAM:
            _raise(
                "Failed to get metric value",
                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
            )
        series = self._series
        source = _total_source
        if source is not None:  # outside the lock: asking sends pending updates first
            total = source(series.family, dict(series.labels))
            if total is not None:
                return total
        with _store.lock:
            return series.value

    def _pending(self) -> dict[str, Any]:
        """The series' pending change, marking it dirty (caller holds the lock)."""
        series = self._series
        if series.pending is None:
            series.pending = {}
            _store.dirty[self._key] = series
        return series.pending


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            return float(value)
        except (TypeError, ValueError):
            _raise(where, f"value must be a number, got {type(value).__name__}")
    return float(value)
