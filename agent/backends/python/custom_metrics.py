"""The agent's copy of Python models' custom metrics (`pb_utils.MetricFamily`), for /metrics.

Where it sits: the Python backend is its only writer and `agent.api.metrics` renders it, so it
lives in the lowest layer the writer can import (agent.backends; agent.tensors and
agent.repository are about tensors and model folders, not metrics). One store per agent, owned by
the `StatisticsRegistry` the daemon creates (no module-level global), which already reaches
both the loader (which creates backends) and `build_registry`.

Workers keep the authoritative values and send coalesced changes (`agent.pb_utils.metrics`
`take_updates`): increments as deltas, gauge sets as absolutes, histogram bucket counts and sums
as deltas. Applying deltas makes instances of one model (several workers) that use the same
family and labels share one series, as in Triton, where they are one Prometheus metric.

Lifetime as Triton's: families are process-wide and stay once created; a series goes when the
last worker that created it goes (`release`, on unload), like Triton's reference-counted metrics
that the Python `Metric` objects hold.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("COUNTER", "GAUGE", "HISTOGRAM")
_Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class SeriesSnapshot:
    """One labelled metric at scrape time; histograms carry bucket counts (not cumulative)."""

    labels: dict[str, str]
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)
    total: float = 0.0


@dataclass(slots=True)
class FamilySnapshot:
    name: str
    description: str
    kind: str  # one of KINDS
    series: list[SeriesSnapshot]


@dataclass(slots=True)
class _Series:
    data: SeriesSnapshot
    owners: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Family:
    description: str
    kind: str
    series: dict[_Labels, _Series] = field(default_factory=dict)


class CustomMetricStore:
    """Families and series of every Python model; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def apply(self, source: str, meta: Mapping[str, Any]) -> list[str]:
        """Apply one METRICS message from `source` (a worker); returns what was refused, worded
        for the log (a family another model declared with another kind, malformed items)."""
        refused: list[str] = []
        with self._lock:
            for item in meta.get("families") or []:
                name, kind = str(item.get("name", "")), str(item.get("kind", ""))
                known = self._families.get(name)
                if kind not in KINDS:
                    refused.append(f"metric family '{name}': unknown kind {kind!r}")
                elif known is None:
                    self._families[name] = _Family(str(item.get("description", "")), kind)
                elif known.kind != kind:
                    refused.append(
                        f"metric family '{name}' already exists with a different kind "
                        f"({known.kind}, not {kind}); its updates are dropped"
                    )
            for item in meta.get("metrics") or []:
                problem = self._update(source, item)
                if problem:
                    refused.append(problem)
        return refused

    def _update(self, source: str, item: Mapping[str, Any]) -> str | None:
        name = str(item.get("family", ""))
        family = self._families.get(name)
        if family is None:
            return None  # refused when declared: already reported
        raw = item.get("labels") or {}
        labels: _Labels = tuple(sorted((str(k), str(v)) for k, v in dict(raw).items()))
        series = family.series.get(labels)
        try:
            if series is None:
                data = SeriesSnapshot(dict(labels))
                if family.kind == "HISTOGRAM":
                    data.buckets = tuple(float(b) for b in item.get("buckets") or [])
                    data.counts = [0] * (len(data.buckets) + 1)
                series = family.series[labels] = _Series(data)
            series.owners.add(source)
            data = series.data
            if "set" in item:
                data.value = float(item["set"])
            data.value += float(item.get("inc", 0.0))
            counts = item.get("counts")
            if counts is not None and len(counts) == len(data.counts):
                data.counts = [a + int(b) for a, b in zip(data.counts, counts, strict=True)]
                data.total += float(item.get("sum", 0.0))
        except (TypeError, ValueError) as exc:
            return f"metric family '{name}': malformed update: {exc}"
        return None

    def value(self, family: str, labels: Mapping[str, str]) -> float | None:
        """The total of one counter or gauge over every worker (`Metric.value()`), or None."""
        key: _Labels = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        with self._lock:
            known = self._families.get(family)
            series = None if known is None else known.series.get(key)
            return None if series is None else series.data.value

    def release(self, source: str) -> None:
        """A worker is gone: drop the series no other live worker holds (families stay)."""
        with self._lock:
            for family in self._families.values():
                for labels, series in list(family.series.items()):
                    series.owners.discard(source)
                    if not series.owners:
                        del family.series[labels]

    def snapshot(self) -> list[FamilySnapshot]:
        """Every family (sorted by name) with copies of its series."""
        with self._lock:
            return [
                FamilySnapshot(
                    name,
                    family.description,
                    family.kind,
                    [
                        SeriesSnapshot(
                            dict(s.data.labels),
                            s.data.value,
                            s.data.buckets,
                            list(s.data.counts),
                            s.data.total,
                        )
                        for s in family.series.values()
                    ],
                )
                for name, family in sorted(self._families.items())
            ]
