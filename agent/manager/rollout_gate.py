"""A rollout's gate: SLO rules judged over a wave's telemetry, against the old version. Pure.

    rules = parse_gate("p95_ms<=50,error_rate<=0.001")
    verdict = judge(rules, wave_window, baseline_window, min_requests=20)

A `Window` sums what devices reported over the soak: requests and failures are differences of
the cumulative counters between each device's first and last telemetry in the window (a
restarted device whose counters went down counts from zero), latency is the worst p95/p99 any
device reported last. The baseline is the same over the devices still on the old version; its
figures go into every verdict so an operator sees the comparison. Rules:

    p95_ms, p99_ms     the wave's worst p95/p99 latency in ms
    error_rate         failures / requests over the window, 0..1
    p95_ratio          the wave's p95 over the baseline's (no verdict without a baseline)
    error_rate_delta   the wave's error rate minus the baseline's

Every rule is `NAME<=LIMIT` (the only direction an SLO has).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

METRICS = ("p95_ms", "p99_ms", "error_rate", "p95_ratio", "error_rate_delta")
_RULE = re.compile(r"^\s*([a-z0-9_]+)\s*<=\s*([0-9.eE+-]+)\s*$")


class GateError(ValueError):
    """A gate expression that cannot be read."""


@dataclass(frozen=True, slots=True)
class GateRule:
    """`metric <= limit`."""

    metric: str
    limit: float

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit:g}"


def parse_gate(text: str) -> tuple[GateRule, ...]:
    """Rules from `"p95_ms<=50,error_rate<=0.001"` ("" : no rule).

    Raises:
        GateError: an unknown metric, another operator, or a limit that is not a number >= 0.
    """
    rules = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _RULE.match(part)
        if match is None:
            raise GateError(f"gate rule {part!r} is not METRIC<=LIMIT (e.g. p95_ms<=50)")
        metric, raw = match.groups()
        if metric not in METRICS:
            raise GateError(f"gate metric {metric!r} is not one of {', '.join(METRICS)}")
        try:
            limit = float(raw)
        except ValueError:
            raise GateError(f"gate limit {raw!r} of {metric} is not a number") from None
        if not math.isfinite(limit) or limit < 0:
            raise GateError(f"gate limit of {metric} must be a number >= 0")
        rules.append(GateRule(metric, limit))
    return tuple(rules)


@dataclass(slots=True)
class DeviceWindow:
    """One device's telemetry of one version over the window: first and last counters."""

    first_requests: int
    first_failures: int
    requests: int
    failures: int
    p95_ms: float | None = None
    p99_ms: float | None = None

    def add(self, requests: int, failures: int, p95_ms: float | None, p99_ms: float | None) -> None:
        """Take a later telemetry reading."""
        if requests < self.requests:  # the counters restarted (a reload or agent restart)
            self.first_requests, self.first_failures = 0, 0
        self.requests, self.failures = requests, failures
        self.p95_ms, self.p99_ms = p95_ms, p99_ms

    def to_json(self) -> list[Any]:
        """Compact form for the rollout's stored state."""
        f = self
        return [f.first_requests, f.first_failures, f.requests, f.failures, f.p95_ms, f.p99_ms]

    @classmethod
    def from_json(cls, row: list[Any]) -> DeviceWindow:
        """The stored form back."""
        return cls(int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4], row[5])


@dataclass(frozen=True, slots=True)
class Window:
    """Figures over a set of devices (see module docstring)."""

    devices: int = 0
    requests: int = 0
    failures: int = 0
    p95_ms: float | None = None
    p99_ms: float | None = None

    @property
    def error_rate(self) -> float | None:
        """failures / requests; None without requests."""
        return self.failures / self.requests if self.requests else None

    def to_json(self) -> dict[str, Any]:
        """The figures, as events carry them."""
        rate = self.error_rate
        return {
            "devices": self.devices,
            "requests": self.requests,
            "failures": self.failures,
            "error_rate": None if rate is None else round(rate, 6),
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
        }


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def window_of(devices: Iterable[DeviceWindow]) -> Window:
    """The sum of device windows."""
    items = list(devices)
    return Window(
        devices=len(items),
        requests=sum(d.requests - d.first_requests for d in items),
        failures=sum(d.failures - d.first_failures for d in items),
        p95_ms=_worst(d.p95_ms for d in items),
        p99_ms=_worst(d.p99_ms for d in items),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's answer: passed, or the rules broken; with the figures behind it."""

    passed: bool
    breaches: tuple[str, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)


def _value(metric: str, wave: Window, base: Window) -> float | None:
    if metric == "p95_ms":
        return wave.p95_ms
    if metric == "p99_ms":
        return wave.p99_ms
    if metric == "error_rate":
        return wave.error_rate
    if metric == "p95_ratio":
        if wave.p95_ms is None or not base.p95_ms:
            return None
        return wave.p95_ms / base.p95_ms
    wave_rate, base_rate = wave.error_rate, base.error_rate
    return None if wave_rate is None or base_rate is None else wave_rate - base_rate


def judge(
    rules: Iterable[GateRule], wave: Window, baseline: Window, *, min_requests: int = 0
) -> Verdict:
    """Judge the wave's window.

    A rule without a value (no traffic, no baseline) is not broken; fewer than `min_requests`
    requests in the wave is a breach of its own ("not enough traffic"), so a gate that asks for
    evidence never passes on silence.
    """
    breaches = []
    values: dict[str, float | None] = {}
    for rule in rules:
        value = _value(rule.metric, wave, baseline)
        values[rule.metric] = None if value is None else round(value, 6)
        if value is not None and value > rule.limit:
            breaches.append(f"{rule.metric} {value:.6g} > {rule.limit:g}")
    if wave.requests < min_requests:
        breaches.append(f"not enough traffic: {wave.requests} requests < {min_requests}")
    figures = {"candidate": wave.to_json(), "baseline": baseline.to_json(), "values": values}
    return Verdict(not breaches, tuple(breaches), figures)
