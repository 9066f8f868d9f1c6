"""Prometheus metrics with Triton's names, read from the statistics at scrape time.

`build_registry` returns a fresh `prometheus_client.CollectorRegistry` holding one collector; the
default global registry is never touched, so two agents (or two tests) in one process do not
share metrics. Nothing is pushed: each scrape snapshots `agent.scheduling.statistics` and the host.

Naming: Triton's counters carry no `_total` (`nv_inference_request_success`, ...) and are
typed `counter`; dashboards and alerts written for Triton query those names. prometheus-client's
own exposition would rename a counter to `<name>_total`, so `render` writes the text with
`agent.api.exposition`, which keeps each family's exact name. Summaries, gauges and histograms
are as prometheus-client writes them.

Emitted, per model version (labels `model`, `version`):
    nv_inference_request_success, nv_inference_request_failure (+ `reason`), nv_inference_count,
    nv_inference_exec_count, nv_inference_pending_request_count (gauge),
    nv_inference_{request,queue,compute_input,compute_infer,compute_output}_duration_us,
    nv_inference_{request,queue,compute_input,compute_infer,compute_output}_summary_us (summary),
    nv_cache_num_hits_per_model, nv_cache_num_misses_per_model,
    nv_cache_hit_duration_per_model, nv_cache_miss_duration_per_model (µs).
Python models' custom metrics (`pb_utils.MetricFamily`,
`agent.backends.python.custom_metrics`): each family under its own name and description,
counters typed and named as the ones above.
Host-wide: nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes, and, with a
`MemorySource`, edge_agent_memory_budget_bytes, edge_agent_memory_used_bytes (everything
reserved: the agent's own memory, requests in flight, models), edge_agent_memory_models_bytes
(the models' plans alone), and with its
pool for requests in flight edge_agent_memory_inflight_capacity_bytes, _inflight_bytes,
_inflight_peak_bytes and the counter edge_agent_memory_inflight_refused_total. With a
`GpuReader` (NVML, or tegrastats on Jetson; `agent.device.gpu`), per GPU (label
`gpu_uuid`): nv_gpu_utilization (0.0 to 1.0), nv_gpu_memory_total_bytes,
nv_gpu_memory_used_bytes, nv_gpu_power_usage and nv_gpu_power_limit (watts), and
nv_energy_consumption (joules since the agent started; a counter); a figure the
GPU does not report is left out for that GPU. With a
`CanarySource`, edge_agent_canary_share{model,version}: each running canary's share of the
model's unversioned traffic, for the candidate and the baseline.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Final, Protocol

import psutil
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from agent.api.exposition import render_text
from agent.api.http.connection import CONNECTION_GUARD, ConnectionGuard, connection_middleware
from agent.api.http.limits import ConnectionLimits
from agent.backends.python.custom_metrics import FamilySnapshot
from agent.device.gpu import GpuReader, GpuReading
from agent.models.inflight import InflightBytes
from agent.scheduling.statistics import (
    FIRST_RESPONSE_BUCKETS_MS,
    Duration,
    InferStat,
    Series,
    StatisticsRegistry,
    StatsSnapshot,
)

# The classic text format that `generate_latest` writes (Triton serves the same version).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_LABELS: Final = ("model", "version")

# Each latency series, its words in Triton's help text, and the statistic it sums.
_DURATIONS: Final[tuple[tuple[Series, str, InferStat], ...]] = (
    ("request", "inference request", "success"),
    ("queue", "inference queuing", "queue"),
    ("compute_input", "compute input", "compute_input"),
    ("compute_infer", "compute infer", "compute_infer"),
    ("compute_output", "compute output", "compute_output"),
)


class MemorySource(Protocol):
    """The agent's model-memory accounting: the budget it keeps to and what it uses now."""

    def budget_bytes(self) -> int:
        """Bytes the agent may spend on loaded models."""
        ...

    def used_bytes(self) -> int:
        """Bytes the loaded models hold now."""
        ...

    def models_bytes(self) -> int:
        """Bytes the loaded model versions' plans reserved."""
        ...

    @property
    def inflight(self) -> InflightBytes | None:
        """The budget's pool for requests in flight (None: not counted)."""
        ...


class CanarySource(Protocol):
    """Running canaries (`agent.canary.control.CanaryManager`)."""

    def shares(self) -> list[tuple[str, int, float]]:
        """(model, version, share of the model's unversioned traffic) per routed version."""
        ...


class HostProbe(Protocol):
    """Host CPU and RAM, as Triton's CPU metrics report them."""

    def cpu_utilization(self) -> float:
        """Busy share of all cores since the previous call, 0.0 to 1.0."""
        ...

    def memory_bytes(self) -> tuple[int, int]:
        """(total, used) RAM in bytes; used is total minus available, as in /proc/meminfo."""
        ...


class PsutilHostProbe:
    """`HostProbe` over psutil, keeping its own previous CPU sample (psutil's is global)."""

    def __init__(self) -> None:
        self._last = psutil.cpu_times()

    def cpu_utilization(self) -> float:
        """Busy share since the previous call (since construction for the first)."""
        now = psutil.cpu_times()
        before, self._last = self._last, now
        idle = _idle(now) - _idle(before)
        total = sum(now) - sum(before)
        if total <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - idle / total))

    def memory_bytes(self) -> tuple[int, int]:
        """(total, total - available) from psutil.virtual_memory()."""
        mem = psutil.virtual_memory()
        return mem.total, mem.total - mem.available


def _idle(times: object) -> float:
    """Idle plus iowait seconds, as Triton counts idle in /proc/stat."""
    return float(getattr(times, "idle", 0.0)) + float(getattr(times, "iowait", 0.0))


class TritonCollector:
    """A prometheus-client collector producing Triton's metric families on each scrape."""

    def __init__(
        self,
        stats: StatisticsRegistry,
        memory: MemorySource | None,
        host: HostProbe,
        canary: CanarySource | None = None,
        gpu: GpuReader | None = None,
    ) -> None:
        self._stats = stats
        self._memory = memory
        self._host = host
        self._canary = canary
        self._gpu = gpu

    def describe(self) -> Iterable[Metric]:
        """No fixed description: the families depend on the models loaded at scrape time."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Snapshot every model's statistics and the host, and yield the metric families."""
        snaps = [m.snapshot() for m in self._stats.all()]
        yield from _model_families(snaps)
        yield from self._host_families()
        if self._gpu is not None:
            yield from _gpu_families(self._gpu.read())
        yield from _custom_families(self._stats.custom_metrics.snapshot())
        if self._canary is not None:
            family = GaugeMetricFamily(
                "edge_agent_canary_share",
                "Share of a model's unversioned requests routed to a version by a running canary",
                labels=_LABELS,
            )
            for model, version, share in self._canary.shares():
                family.add_metric([model, str(version)], share)
            yield family

    def _host_families(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "nv_cpu_utilization",
            "CPU utilization rate [0.0 - 1.0]",
            value=self._host.cpu_utilization(),
        )
        total, used = self._host.memory_bytes()
        yield GaugeMetricFamily(
            "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=total
        )
        yield GaugeMetricFamily(
            "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=used
        )
        if self._memory is not None:
            yield GaugeMetricFamily(
                "edge_agent_memory_budget_bytes",
                "Memory the agent may use for loaded models, in bytes",
                value=self._memory.budget_bytes(),
            )
            yield GaugeMetricFamily(
                "edge_agent_memory_used_bytes",
                "Memory the agent's loaded models use, in bytes",
                value=self._memory.used_bytes(),
            )
            yield GaugeMetricFamily(
                "edge_agent_memory_models_bytes",
                "Memory the loaded model versions' plans reserved, in bytes",
                value=self._memory.models_bytes(),
            )
            inflight = self._memory.inflight
            if inflight is not None:
                figures = inflight.figures()
                yield GaugeMetricFamily(
                    "edge_agent_memory_inflight_capacity_bytes",
                    "The memory budget's share kept for requests in flight, in bytes",
                    value=figures.capacity_bytes,
                )
                yield GaugeMetricFamily(
                    "edge_agent_memory_inflight_bytes",
                    "Bytes held now by requests in flight (bodies, tensors, responses)",
                    value=figures.held_bytes,
                )
                yield GaugeMetricFamily(
                    "edge_agent_memory_inflight_peak_bytes",
                    "The most bytes requests in flight held at once since the start",
                    value=figures.peak_bytes,
                )
                refused = Metric(
                    "edge_agent_memory_inflight_refused_total",
                    "Requests refused because they did not fit in the memory in flight",
                    "counter",
                )
                refused.add_sample(refused.name, {}, figures.refused)
                yield refused


# Triton's GPU families: name, help text, the figure, counter (True) or gauge.
_GPU_FAMILIES: Final[tuple[tuple[str, str, Callable[[GpuReading], float | None], bool], ...]] = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", lambda g: g.utilization, False),
    (
        "nv_gpu_memory_total_bytes",
        "GPU total memory, in bytes",
        lambda g: g.memory_total_bytes,
        False,
    ),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", lambda g: g.memory_used_bytes, False),
    ("nv_gpu_power_usage", "GPU power usage in watts", lambda g: g.power_w, False),
    ("nv_gpu_power_limit", "GPU power management limit in watts", lambda g: g.power_limit_w, False),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the agent started",
        lambda g: g.energy_j,
        True,
    ),
)


def _gpu_families(readings: list[GpuReading]) -> Iterator[Metric]:
    """Triton's GPU metrics, one sample per GPU that reports the figure."""
    if not readings:
        return
    for name, doc, figure, counter in _GPU_FAMILIES:
        family = Metric(name, doc, "counter" if counter else "gauge")
        for reading in readings:
            value = figure(reading)
            if value is not None:
                family.add_sample(name, {"gpu_uuid": reading.uuid}, float(value))
        if family.samples:
            yield family


def _custom_families(families: list[FamilySnapshot]) -> Iterator[Metric]:
    """Python models' `pb_utils.MetricFamily` families, under the names the models gave.

    Counters are typed and named as the agent's own (see the module docstring: no `_total`);
    gauges and histograms keep their types. Metrics of one family may have different labels.
    """
    types = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
    for fam in families:
        if not fam.series:
            continue
        family = Metric(fam.name, fam.description, types[fam.kind])
        for s in fam.series:
            if fam.kind != "HISTOGRAM":
                family.add_sample(fam.name, s.labels, s.value)
                continue
            cumulative = 0
            for bound, count in zip((*s.buckets, math.inf), s.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == math.inf else format(bound, "g")
                family.add_sample(fam.name + "_bucket", {**s.labels, "le": le}, cumulative)
            family.add_sample(fam.name + "_count", s.labels, float(cumulative))
            family.add_sample(fam.name + "_sum", s.labels, s.total)
        yield family


def _counter(
    name: str, doc: str, snaps: list[StatsSnapshot], value: Callable[[StatsSnapshot], int]
) -> Metric:
    """A counter family under its exact name (module docstring), one sample per model version."""
    family = Metric(name, doc, "counter")
    for s in snaps:
        family.add_sample(name, {"model": s.name, "version": s.version}, float(value(s)))
    return family


def _summary(name: str, doc: str, snaps: list[StatsSnapshot], series: Series) -> Metric:
    """A summary family: `_count` and `_sum` (cumulative) plus the window's quantiles."""
    family = Metric(name, doc, "summary")
    for s in snaps:
        labels = {"model": s.name, "version": s.version}
        summary = s.summary(series)
        family.add_sample(name + "_count", labels, float(summary.count))
        family.add_sample(name + "_sum", labels, float(summary.sum_us))
        for q, v in summary.quantiles:
            family.add_sample(name, {**labels, "quantile": repr(q)}, v)
    return family


def _us(duration: Duration) -> int:
    """Nanoseconds to whole microseconds, Triton's unit for latency metrics."""
    return duration.ns // 1000


def _in_us(stat: InferStat) -> Callable[[StatsSnapshot], int]:
    return lambda s: _us(s.stat(stat))


def _first_response(snaps: list[StatsSnapshot]) -> Metric:
    """Triton's first-response histogram: decoupled models' versions that answered once."""
    name = "nv_inference_first_response_histogram_ms"
    family = Metric(name, "Duration from request to first response in milliseconds", "histogram")
    for s in snaps:
        if s.first_response is None:
            continue
        counts, total = s.first_response
        labels = {"model": s.name, "version": s.version}
        cumulative = 0
        for bound, count in zip((*FIRST_RESPONSE_BUCKETS_MS, math.inf), counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == math.inf else format(bound, "g")
            family.add_sample(name + "_bucket", {**labels, "le": le}, float(cumulative))
        family.add_sample(name + "_count", labels, float(cumulative))
        family.add_sample(name + "_sum", labels, total)
    return family


def _model_families(snaps: list[StatsSnapshot]) -> Iterator[Metric]:
    yield _counter(
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        snaps,
        lambda s: s.stat("success").count,
    )
    failure = Metric(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "counter",
    )
    for s in snaps:
        for reason, count in s.failures:
            labels = {"model": s.name, "version": s.version, "reason": reason}
            failure.add_sample(failure.name, labels, float(count))
    yield failure
    yield _counter(
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        snaps,
        lambda s: s.inference_count,
    )
    yield _counter(
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        snaps,
        lambda s: s.execution_count,
    )
    pending = GaugeMetricFamily(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        labels=_LABELS,
    )
    for s in snaps:
        pending.add_metric([s.name, s.version], float(s.pending))
    yield pending
    for series, what, stat in _DURATIONS:
        cached = "includes" if series in {"request", "queue"} else "does not include"
        yield _counter(
            f"nv_inference_{series}_duration_us",
            f"Cumulative {what} duration in microseconds ({cached} cached requests)",
            snaps,
            _in_us(stat),
        )
    for series, what, _ in _DURATIONS:
        cached = "includes" if series == "queue" else "does not include"
        yield _summary(
            f"nv_inference_{series}_summary_us",
            f"Summary of {what} duration in microseconds ({cached} cached requests)",
            snaps,
            series,
        )
    if any(s.first_response is not None for s in snaps):
        yield _first_response(snaps)
    yield _counter(
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model",
        snaps,
        lambda s: s.stat("cache_hit").count,
    )
    yield _counter(
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        snaps,
        lambda s: s.stat("cache_miss").count,
    )
    yield _counter(
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        snaps,
        _in_us("cache_hit"),
    )
    yield _counter(
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert + lookup) duration per model, in microseconds",
        snaps,
        _in_us("cache_miss"),
    )


def build_registry(
    stats: StatisticsRegistry,
    memory: MemorySource | None,
    *,
    host: HostProbe | None = None,
    canary: CanarySource | None = None,
    gpu: GpuReader | None = None,
) -> CollectorRegistry:
    """A new registry exposing Triton's metrics for `stats` (never the global default one).

    Args:
        stats: the statistics the scheduler records into.
        memory: the agent's memory accounting, or None to leave out the `edge_agent_memory_*`
            gauges.
        host: where CPU and RAM figures come from; psutil unless a test passes a fake.
        canary: running canaries, or None to leave out `edge_agent_canary_share`.
        gpu: where GPU figures come from (read on each scrape: pass a `CachedGpuReader`), or
            None to leave out the `nv_gpu_*` families.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(stats, memory, host or PsutilHostProbe(), canary, gpu))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus text format, and its Content-Type."""
    return render_text(registry), CONTENT_TYPE


METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)


def create_metrics_app(
    registry: CollectorRegistry, limits: ConnectionLimits | None = None
) -> web.Application:
    """An aiohttp app serving `GET /metrics` from `registry` (run on its own --metrics-port),
    with its connection guard (`limits`: None, the defaults)."""
    app = web.Application(middlewares=[connection_middleware])
    app[CONNECTION_GUARD] = ConnectionGuard(limits if limits is not None else ConnectionLimits())
    app[METRICS_REGISTRY] = registry
    app.add_routes([web.get("/metrics", _metrics)])
    return app


async def _metrics(request: web.Request) -> web.Response:
    # Off the event loop: a scrape may read the GPU (NVML, or tegrastats for up to a second).
    body, content_type = await asyncio.to_thread(render, request.app[METRICS_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": content_type})
