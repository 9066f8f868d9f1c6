"""SLO and drift alerts from periodic statistics samples: pure, with the time passed in.

The fleet link samples every served model version at each telemetry tick and calls
`SloEvaluator.evaluate(now, samples)`; what comes back are the alerts to publish as events.

Invariants:
    * No clock and no I/O: `now` is monotonic seconds given by the caller, never decreasing.
    * Edge-triggered: a breach is reported once when it starts (`slo_breach`) and once when it
      ends (`slo_recovered`); the same for queue drift (`queue_drift`, `queue_drift_recovered`).
      A sustained breach does not flood the events topic.
    * Bounded: per model version, samples older than the window are dropped (one is kept as the
      window's base); state of versions no longer sampled is forgotten.
    * An SLO is judged only over at least `min_requests` requests in the window, so one slow
      request on an idle model is not an alert.
    * Drift compares the mean queue time of the last tick with an exponentially weighted
      baseline of earlier ticks; the baseline does not learn while drift lasts.

Each alert carries the figures that triggered it (observed value, target, requests, window).

Example:
    >>> slo = SloEvaluator(parse_slo_targets(["m:p95_ms=50"]))
    >>> s = Sample("m", 1, success=100, failure=0, p95_us=80_000.0, p99_us=90_000.0,
    ...            queue_count=100, queue_ns=0)
    >>> [a.kind for a in slo.evaluate(0.0, [s])]
    ['slo_breach']
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_MODEL = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$")
_FLOAT_KEYS = ("p95_ms", "p99_ms", "error_rate", "window_s", "drift_factor", "drift_min_ms")
_EWMA_ALPHA = 0.2
_DRIFT_MIN_COUNT = 5  # queue-time samples in a tick needed to judge drift


@dataclass(frozen=True, slots=True)
class SloTarget:
    """The objectives of one model ("*": every model without its own entry)."""

    model: str = "*"
    p95_ms: float | None = None
    p99_ms: float | None = None
    error_rate: float | None = None  # failures / requests, 0..1
    window_s: float = 60.0
    min_requests: int = 20
    drift_factor: float = 3.0  # 0: no drift alerts
    drift_min_ms: float = 1.0  # a jump must also be at least this much above the baseline


@dataclass(frozen=True, slots=True)
class Sample:
    """Cumulative statistics of one model version at one instant (from `ModelStatistics`)."""

    model: str
    version: int
    success: int
    failure: int
    p95_us: float  # request latency over the recent window; NaN when empty
    p99_us: float
    queue_count: int
    queue_ns: int


@dataclass(frozen=True, slots=True)
class Alert:
    """An SLO or drift transition, with the figures that triggered it."""

    kind: str  # slo_breach | slo_recovered | queue_drift | queue_drift_recovered
    model: str
    version: int
    figures: dict[str, float | int | str]


@dataclass(slots=True)
class _State:
    history: deque[tuple[float, Sample]] = field(default_factory=deque)
    breached: set[str] = field(default_factory=set)
    baseline_us: float | None = None
    drifting: bool = False


def parse_slo_targets(entries: Iterable[str]) -> tuple[SloTarget, ...]:
    """Parse `MODEL:key=value,...` entries (keys: p95_ms, p99_ms, error_rate, window_s,
    min_requests, drift_factor, drift_min_ms).

    Raises:
        ValueError: a malformed entry, unknown key, value out of range or a repeated model.

    Returns:
        One target per entry, in order.
    """
    targets: list[SloTarget] = []
    seen: set[str] = set()
    for entry in entries:
        model, sep, spec = entry.partition(":")
        model = model.strip()
        if not sep or not _MODEL.match(model):
            raise ValueError(f"{entry!r}: expected MODEL:key=value,... (MODEL may be *)")
        if model in seen:
            raise ValueError(f"{entry!r}: model {model!r} has two entries")
        seen.add(model)
        values: dict[str, float | int] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, eq, text = item.partition("=")
            values[key.strip()] = _value(entry, key.strip(), text.strip(), eq)
        targets.append(SloTarget(model=model, **values))  # type: ignore[arg-type]
    return tuple(targets)


def _value(entry: str, key: str, text: str, eq: str) -> float | int:
    if not eq:
        raise ValueError(f"{entry!r}: expected key=value, got {key!r}")
    if key == "min_requests":
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{entry!r}: min_requests must be an integer >= 1")
        return int(text)
    if key not in _FLOAT_KEYS:
        known = ", ".join((*_FLOAT_KEYS, "min_requests"))
        raise ValueError(f"{entry!r}: unknown key {key!r} (known: {known})")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{entry!r}: {key} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (key == "window_s" and value <= 0):
        raise ValueError(f"{entry!r}: {key} must be a finite number > 0")
    if key == "error_rate" and value > 1:
        raise ValueError(f"{entry!r}: error_rate is a fraction in 0..1")
    return value


class SloEvaluator:
    """Turns statistics samples into SLO breach and queue drift alerts (see module docstring)."""

    def __init__(self, targets: Sequence[SloTarget]) -> None:
        self._targets = {t.model: t for t in targets}
        self._default = self._targets.get("*", SloTarget())
        self._states: dict[tuple[str, int], _State] = {}

    def target(self, model: str) -> SloTarget:
        """The objectives that apply to `model`."""
        return self._targets.get(model, self._default)

    def evaluate(self, now: float, samples: Iterable[Sample]) -> list[Alert]:
        """Judge one tick's samples; returns the alerts that start or end at this instant."""
        alerts: list[Alert] = []
        live: set[tuple[str, int]] = set()
        for sample in samples:
            key = (sample.model, sample.version)
            live.add(key)
            state = self._states.setdefault(key, _State())
            target = self.target(sample.model)
            previous = state.history[-1][1] if state.history else None
            state.history.append((now, sample))
            while len(state.history) > 2 and state.history[1][0] <= now - target.window_s:
                state.history.popleft()
            alerts.extend(self._slo(state, target, sample))
            if previous is not None:
                alerts.extend(self._drift(state, target, previous, sample))
        for key in set(self._states) - live:
            del self._states[key]
        return alerts

    def _slo(self, state: _State, target: SloTarget, sample: Sample) -> list[Alert]:
        start_t, base = state.history[0]
        requests = (sample.success + sample.failure) - (base.success + base.failure)
        if base is sample:  # first sample: judge its whole history
            requests = sample.success + sample.failure
            failures = sample.failure
        else:
            failures = sample.failure - base.failure
        window = round(state.history[-1][0] - start_t, 3)
        checks: list[tuple[str, float | None, float]] = [
            ("error_rate", target.error_rate, failures / requests if requests else 0.0),
            ("p95_ms", target.p95_ms, sample.p95_us / 1000),
            ("p99_ms", target.p99_ms, sample.p99_us / 1000),
        ]
        alerts: list[Alert] = []
        for metric, limit, observed in checks:
            if limit is None or requests < target.min_requests or math.isnan(observed):
                continue
            breached = observed > limit
            if breached == (metric in state.breached):
                continue
            figures: dict[str, float | int | str] = {
                "metric": metric,
                "observed": round(observed, 6),
                "target": limit,
                "requests": requests,
                "failures": failures,
                "window_s": window,
            }
            if breached:
                state.breached.add(metric)
                alerts.append(Alert("slo_breach", sample.model, sample.version, figures))
            else:
                state.breached.discard(metric)
                alerts.append(Alert("slo_recovered", sample.model, sample.version, figures))
        return alerts

    def _drift(
        self, state: _State, target: SloTarget, previous: Sample, sample: Sample
    ) -> list[Alert]:
        count = sample.queue_count - previous.queue_count
        if target.drift_factor <= 0 or count < _DRIFT_MIN_COUNT:
            return []
        mean_us = (sample.queue_ns - previous.queue_ns) / count / 1000
        baseline = state.baseline_us
        if baseline is None:
            state.baseline_us = mean_us
            return []
        jumped = (
            mean_us > target.drift_factor * baseline
            and mean_us - baseline > target.drift_min_ms * 1000
        )
        figures: dict[str, float | int | str] = {
            "queue_us": round(mean_us, 1),
            "baseline_us": round(baseline, 1),
            "factor": target.drift_factor,
            "requests": count,
        }
        if jumped and not state.drifting:
            state.drifting = True
            return [Alert("queue_drift", sample.model, sample.version, figures)]
        if not jumped:
            state.baseline_us = (1 - _EWMA_ALPHA) * baseline + _EWMA_ALPHA * mean_us
            if state.drifting:
                state.drifting = False
                return [Alert("queue_drift_recovered", sample.model, sample.version, figures)]
        return []
