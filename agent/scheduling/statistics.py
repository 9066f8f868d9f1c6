"""Per-model inference statistics: Triton's statistics extension, kept in memory.

A `ModelStatistics` holds the cumulative counters of one (model, version), which
`GET v2/models[/name[/versions/v]]/stats` returns, plus bounded latency windows from which
`agent.api.metrics` derives the quantiles of Triton's `*_summary_us` metrics.

Invariants:
    * Pure: no clock, no I/O. Callers pass durations in nanoseconds (from `time.monotonic_ns`)
      and wall-clock instants in milliseconds since the epoch.
    * Thread-safe: each record and read takes the instance's lock, so the scheduler may record
      from the event loop and executor threads at once; `snapshot()` copies one consistent state.
    * Counters only grow; each latency window keeps the last `window` observations.
    * No module-level registry: the composition root creates one `StatisticsRegistry` and passes
      it to the scheduler, the HTTP layer and `agent.api.metrics.build_registry`.
    * What each record counts follows Triton's `InferenceStatsAggregator` (core infer_stats.cc),
      except that `inference_count` grows per executed batch (`record_execution`), which gives
      the same total as Triton's per-request count when every request of a batch succeeds.

Usage:
    >>> stats = StatisticsRegistry()
    >>> stats.get("mlp", "1").record_failure(request_ns=5_000, reason="REJECTED", now_ms=0)
    >>> stats.snapshot("mlp")["model_stats"][0]["inference_stats"]["fail"]
    {'count': 1, 'ns': 5000}
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from agent.backends.python.custom_metrics import CustomMetricStore

FailureReason = Literal["REJECTED", "CANCELED", "BACKEND", "OTHER"]  # Triton's `reason` label
FAILURE_REASONS: Final[tuple[FailureReason, ...]] = get_args(FailureReason)

Series = Literal["request", "queue", "compute_input", "compute_infer", "compute_output"]
SERIES: Final[tuple[Series, ...]] = get_args(Series)

InferStat = Literal[
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
    "cache_miss",
]  # fmt: skip
INFER_STATS: Final[tuple[InferStat, ...]] = get_args(InferStat)

# The per-response entries of Triton's `response_stats` (decoupled models), each {count, ns}.
ResponseKind = Literal["success", "fail", "empty_response", "cancel"]
RESPONSE_STATS: Final[tuple[str, ...]] = (
    "compute_infer", "compute_output", "success", "fail", "empty_response", "cancel",
)  # fmt: skip

QUANTILES: Final[tuple[float, ...]] = (0.5, 0.9, 0.95, 0.99)
# Triton's default buckets (ms) of nv_inference_first_response_histogram_ms.
FIRST_RESPONSE_BUCKETS_MS: Final[tuple[float, ...]] = (100.0, 500.0, 2000.0, 5000.0)
DEFAULT_WINDOW: Final = 1024


@dataclass(frozen=True, slots=True)
class Duration:
    """Triton's `$duration_stat`: how many times a statistic was collected and the total ns."""

    count: int = 0
    ns: int = 0

    def plus(self, ns: int) -> Duration:
        """This statistic collected once more, taking `ns`."""
        return Duration(self.count + 1, self.ns + ns)

    def to_json(self) -> dict[str, int]:
        """`{"count", "ns"}`."""
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True, slots=True)
class BatchStat:
    """Compute durations of the executions that ran with one batch size."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration

    def to_json(self) -> dict[str, Any]:
        """Triton's `$batch_stats` object."""
        return {
            "batch_size": self.batch_size,
            "compute_input": self.compute_input.to_json(),
            "compute_infer": self.compute_infer.to_json(),
            "compute_output": self.compute_output.to_json(),
        }


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """One latency series in microseconds: cumulative count and sum, quantiles of the window.

    `quantiles` pairs each of `QUANTILES` with its value over the recent window, NaN while the
    window is empty (as Prometheus summaries report).
    """

    count: int
    sum_us: int
    quantiles: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """A consistent copy of one model version's statistics, taken under its lock."""

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    pending: int
    inference_stats: tuple[tuple[InferStat, Duration], ...]
    failures: tuple[tuple[str, int], ...]
    batch_stats: tuple[BatchStat, ...]
    summaries: tuple[tuple[Series, LatencySummary], ...]
    # Decoupled models: response index -> RESPONSE_STATS entries (empty for other models).
    response_stats: tuple[tuple[int, tuple[Duration, ...]], ...] = ()
    # Decoupled models: per-bucket (FIRST_RESPONSE_BUCKETS_MS, then +Inf) counts of the time
    # from a request's arrival to its first response, and their sum in ms; None before any.
    first_response: tuple[tuple[int, ...], float] | None = None

    def stat(self, name: InferStat) -> Duration:
        """One of Triton's `inference_stats` entries."""
        return dict(self.inference_stats)[name]

    def summary(self, series: Series) -> LatencySummary:
        """The latency summary of one series."""
        return dict(self.summaries)[series]

    def to_json(self) -> dict[str, Any]:
        """Triton's `$model_stat` object."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {k: d.to_json() for k, d in self.inference_stats},
            # Per-response stats of decoupled models; Triton sends {} for all others.
            "response_stats": {
                str(index): {k: d.to_json() for k, d in zip(RESPONSE_STATS, row, strict=True)}
                for index, row in self.response_stats
            },
            "batch_stats": [b.to_json() for b in self.batch_stats],
            "memory_usage": [],
        }


class _Window:
    """Cumulative count/sum of one latency series plus its last `size` observations, in µs."""

    __slots__ = ("count", "recent", "sum_us")

    def __init__(self, size: int) -> None:
        self.count = 0
        self.sum_us = 0
        self.recent: deque[int] = deque(maxlen=size)

    def observe(self, ns: int) -> None:
        us = ns // 1000
        self.count += 1
        self.sum_us += us
        self.recent.append(us)  # a full deque drops its oldest

    def summary(self) -> LatencySummary:
        ordered = sorted(self.recent)
        return LatencySummary(
            self.count, self.sum_us, tuple((q, _nearest_rank(ordered, q)) for q in QUANTILES)
        )


def _nearest_rank(ordered: list[int], q: float) -> float:
    """The nearest-rank quantile of sorted values; monotone in `q`, NaN when empty."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


def _check_ns(*durations: tuple[str, int]) -> None:
    for field, ns in durations:
        if ns < 0:
            raise ValueError(f"{field}_ns must be >= 0, got {ns}")


class ModelStatistics:
    """Cumulative statistics of one model version; every method is thread-safe."""

    def __init__(self, name: str, version: str, *, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._last_inference_ms = 0
        self._inference_count = 0
        self._execution_count = 0
        self._pending = 0
        # Mutable [count, ns] pairs, turned into frozen Durations by snapshot(): recording runs
        # once per request on the event loop and should allocate nothing.
        self._stats: dict[InferStat, list[int]] = {k: [0, 0] for k in INFER_STATS}
        self._failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self._batches: dict[int, list[int]] = {}  # batch size -> [count, in, infer, out ns]
        self._windows: dict[Series, _Window] = {s: _Window(window) for s in SERIES}
        self._responses: dict[int, list[list[int]]] = {}  # index -> RESPONSE_STATS [count, ns]
        self._first_counts: list[int] | None = None  # FIRST_RESPONSE_BUCKETS_MS, then +Inf
        self._first_sum_ms = 0.0
        w = self._windows
        self._success_series = (
            (self._stats["success"], w["request"]),
            (self._stats["queue"], w["queue"]),
            (self._stats["compute_input"], w["compute_input"]),
            (self._stats["compute_infer"], w["compute_infer"]),
            (self._stats["compute_output"], w["compute_output"]),
        )

    def record_success(
        self,
        *,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        now_ms: int,
    ) -> None:
        """Count one successful request that the backend computed.

        Args:
            request_ns: end-to-end duration, from arrival to response.
            queue_ns: time spent waiting for a batch slot.
            compute_input_ns, compute_infer_ns, compute_output_ns: the durations of the
                execution that served it (each request of a batch gets the batch's durations).
            now_ms: wall-clock completion time, milliseconds since the epoch.

        Raises:
            ValueError: a duration is negative.
        """
        observed = (request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns)
        if min(observed) < 0:
            _check_ns(*zip(SERIES, observed, strict=True))
        with self._lock:
            self._last_inference_ms = max(self._last_inference_ms, now_ms)
            for (pair, window), ns in zip(self._success_series, observed, strict=True):
                pair[0] += 1
                pair[1] += ns
                us = ns // 1000  # _Window.observe, inlined: once per request and series
                window.count += 1
                window.sum_us += us
                window.recent.append(us)

    def record_response(self, index: int, kind: ResponseKind, *, ns: int) -> None:
        """Count the `index`-th response of a decoupled request (Triton's `response_stats`).

        `ns`: the time since the request's previous response (or its arrival, for the first):
        the model's time to compute this one. A response with outputs or an error counts under
        compute_infer and compute_output (0 ns: outputs travel as they are) too. The first
        response of a request (index 0, the final flag alone included) also goes into the
        first-response histogram (Triton's nv_inference_first_response_histogram_ms).
        """
        _check_ns(("response", ns))
        with self._lock:
            if index == 0 and kind != "cancel":
                self._observe_first(ns / 1e6)
            row = self._responses.get(index)
            if row is None:
                row = self._responses[index] = [[0, 0] for _ in RESPONSE_STATS]
            entry = row[RESPONSE_STATS.index(kind)]
            entry[0] += 1
            entry[1] += ns
            if kind in ("success", "fail"):
                row[0][0] += 1
                row[0][1] += ns
                row[1][0] += 1

    def _observe_first(self, ms: float) -> None:
        counts = self._first_counts
        if counts is None:
            counts = self._first_counts = [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1)
        slot = next(
            (i for i, bound in enumerate(FIRST_RESPONSE_BUCKETS_MS) if ms <= bound),
            len(FIRST_RESPONSE_BUCKETS_MS),
        )
        counts[slot] += 1
        self._first_sum_ms += ms

    def record_failure(self, *, request_ns: int, reason: FailureReason, now_ms: int) -> None:
        """Count one failed request; as in Triton, `last_inference` does not move.

        Raises:
            ValueError: `reason` is not one of `FAILURE_REASONS`, or `request_ns` is negative.
        """
        del now_ms  # Triton's UpdateFailure leaves last_inference alone.
        _check_ns(("request", request_ns))
        if reason not in FAILURE_REASONS:
            raise ValueError(
                f"unknown failure reason {reason!r}; expected one of {FAILURE_REASONS}"
            )
        with self._lock:
            self._add("fail", request_ns)
            self._failures[reason] += 1

    def record_execution(
        self,
        *,
        batch_size: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        failed: bool = False,
    ) -> None:
        """Count one model execution of `batch_size` rows. `failed`: the model raised (a
        Python model's `execute`); as Triton, it counts in `execution_count` and `batch_stats`
        but its rows not in `inference_count`.

        Raises:
            ValueError: `batch_size` < 1 or a duration is negative.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if min(compute_input_ns, compute_infer_ns, compute_output_ns) < 0:
            _check_ns(
                ("compute_input", compute_input_ns),
                ("compute_infer", compute_infer_ns),
                ("compute_output", compute_output_ns),
            )
        with self._lock:
            self._execution_count += 1
            if not failed:
                self._inference_count += batch_size
            row = self._batches.get(batch_size)
            if row is None:
                row = self._batches[batch_size] = [0, 0, 0, 0]
            row[0] += 1
            row[1] += compute_input_ns
            row[2] += compute_infer_ns
            row[3] += compute_output_ns

    def record_cache_hit(
        self, *, ns: int, now_ms: int, request_ns: int | None = None, queue_ns: int = 0
    ) -> None:
        """Count one request answered from the response cache.

        Success and queue move (with `request_ns`, defaulting to `ns`, and `queue_ns`), cache_hit
        counts the lookup time `ns`; compute, inference and execution counts do not move.

        Raises:
            ValueError: a duration is negative.
        """
        request = ns if request_ns is None else request_ns
        _check_ns(("cache_hit", ns), ("request", request), ("queue", queue_ns))
        with self._lock:
            self._last_inference_ms = max(self._last_inference_ms, now_ms)
            self._add("success", request)
            self._add("queue", queue_ns)
            self._add("cache_hit", ns)
            # Triton leaves cached requests out of the request summary (DLIS-4762).
            self._windows["queue"].observe(queue_ns)

    def record_cache_miss(self, *, ns: int) -> None:
        """Count one cache miss; `ns` (lookup plus insert) also adds to the request duration.

        Raises:
            ValueError: `ns` is negative.
        """
        _check_ns(("cache_miss", ns))
        with self._lock:
            self._add("cache_miss", ns)
            self._stats["success"][1] += ns

    def _add(self, stat: InferStat, ns: int) -> None:
        pair = self._stats[stat]  # caller holds the lock
        pair[0] += 1
        pair[1] += ns

    def pending_inc(self) -> None:
        """One more request is queued or executing."""
        with self._lock:
            self._pending += 1

    def pending_dec(self) -> None:
        """One request left the scheduler (never below zero)."""
        with self._lock:
            self._pending = max(0, self._pending - 1)

    def set_pending(self, n: int) -> None:
        """Set the pending-request gauge outright."""
        if n < 0:
            raise ValueError(f"pending must be >= 0, got {n}")
        with self._lock:
            self._pending = n

    def snapshot(self) -> StatsSnapshot:
        """A consistent copy of every counter, summary and gauge."""
        with self._lock:
            return StatsSnapshot(
                name=self.name,
                version=self.version,
                last_inference_ms=self._last_inference_ms,
                inference_count=self._inference_count,
                execution_count=self._execution_count,
                pending=self._pending,
                inference_stats=tuple((k, Duration(*pair)) for k, pair in self._stats.items()),
                failures=tuple(self._failures.items()),
                batch_stats=tuple(
                    BatchStat(k, Duration(n, i), Duration(n, r), Duration(n, o))
                    for k, (n, i, r, o) in sorted(self._batches.items())
                ),
                summaries=tuple((s, self._windows[s].summary()) for s in SERIES),
                response_stats=tuple(
                    (i, tuple(Duration(*pair) for pair in row))
                    for i, row in sorted(self._responses.items())
                ),
                first_response=None
                if self._first_counts is None
                else (tuple(self._first_counts), self._first_sum_ms),
            )

    def to_json(self) -> dict[str, Any]:
        """Triton's `$model_stat` JSON object for this model version."""
        return self.snapshot().to_json()


def _version_key(version: str) -> tuple[int, int, str]:
    """Numeric versions in numeric order ("2" before "10"), then any others by text."""
    numeric = version.isascii() and version.isdigit()  # "²" is a digit int() refuses
    return (0, int(version), "") if numeric else (1, 0, version)


class StatisticsRegistry:
    """All models' statistics, keyed by (name, version); thread-safe."""

    def __init__(self, *, window: int = DEFAULT_WINDOW) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], ModelStatistics] = {}
        # Python models' custom metrics (pb_utils.MetricFamily): carried here because this
        # registry already reaches both the loader (which creates backends) and /metrics.
        self.custom_metrics = CustomMetricStore()

    def get(self, model: str, version: str) -> ModelStatistics:
        """The statistics of one model version, created empty on first use."""
        key = (model, version)
        with self._lock:
            stats = self._models.get(key)
            if stats is None:
                stats = ModelStatistics(model, version, window=self._window)
                self._models[key] = stats
            return stats

    def remove(self, model: str, version: str) -> None:
        """Forget a model version (on unload); unknown ones are ignored."""
        with self._lock:
            self._models.pop((model, version), None)

    def all(self) -> list[ModelStatistics]:
        """Every model version's statistics, sorted by name then version."""
        with self._lock:
            found = list(self._models.values())
        return sorted(found, key=lambda s: (s.name, _version_key(s.version)))

    def snapshot(self, model: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's `$stats_model_response`, optionally filtered by model and version.

        Returns an empty `model_stats` list when nothing matches; whether that is an error
        (Triton answers 400 for an unknown model) is for the caller, which knows the repository.
        """
        return {
            "model_stats": [
                s.to_json()
                for s in self.all()
                if (model is None or s.name == model) and (version is None or s.version == version)
            ]
        }
