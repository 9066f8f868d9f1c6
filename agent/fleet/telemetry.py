"""What a telemetry message says: per model version and agent-wide figures, and the GPU.

`TelemetrySampler.sample(now)` reads the statistics registry, the memory ledger and the injected
probes, and returns the telemetry body plus the `agent.fleet.slo.Sample`s the SLO evaluator judges.
It keeps the previous counters per model version to turn them into rates; `now` is monotonic
seconds passed in. The probes may do I/O (disk usage, NVML, tegrastats): call `sample` from a
worker thread.

GPU figures come from an `agent.device.gpu.GpuReader` (NVML through nvidia-ml-py,
else one line of `tegrastats` on Jetson, whose GPU shares the RAM), the same figures `/metrics`
reports; without one, or when it reads nothing, the `gpu` key is omitted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from agent.device.gpu import GpuReader
from agent.fleet.documents import model_telemetry
from agent.fleet.slo import Sample
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.scheduling.statistics import LatencySummary, StatsSnapshot

logger = logging.getLogger(__name__)


def _quantiles_us(summary: LatencySummary) -> dict[str, float | None]:
    names = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99"}
    return {
        names[q]: None if math.isnan(v) else round(v, 1) for q, v in summary.quantiles if q in names
    }


class TelemetrySampler:
    """Builds telemetry bodies (see module docstring).

    Args:
        registry: The served models and their statistics.
        ledger: The memory budget, when the agent has one.
        cache_disk: Bytes the model cache uses on disk (None: no cache).
        sync_state: The sync loop's last state (None: no sync configured).
        gpu: A GPU reader (None: the `gpu` key is omitted).
        started: Monotonic seconds when the agent started (for `uptime_s`).
        rejected: Versions rejected on this device, with cause and reason (None: omitted).
    """

    def __init__(
        self,
        registry: ModelRegistry,
        ledger: MemoryLedger | None,
        *,
        started: float,
        cache_disk: Callable[[], int] | None = None,
        sync_state: Callable[[], Mapping[str, Any]] | None = None,
        gpu: GpuReader | None = None,
        rejected: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._registry = registry
        self._rejected = rejected
        self._ledger = ledger
        self._cache_disk = cache_disk
        self._sync_state = sync_state
        self._gpu = gpu
        self._started = started
        self._previous: dict[tuple[str, int], tuple[float, int]] = {}

    def sample(self, now: float) -> tuple[dict[str, Any], list[Sample]]:
        """The telemetry body (without schema, device and seq) and the SLO samples."""
        models: list[dict[str, Any]] = []
        samples: list[Sample] = []
        seen: dict[tuple[str, int], tuple[float, int]] = {}
        for served in sorted(self._registry.served_models(), key=lambda s: s.name):
            for version, loaded in sorted(served.versions.items()):
                snap = loaded.stats.snapshot()
                key = (served.name, version)
                seen[key] = (now, snap.inference_count)
                models.append(_model(served.name, version, snap, now, self._previous.get(key)))
                samples.append(_slo_sample(served.name, version, snap))
        self._previous = seen
        body: dict[str, Any] = {"uptime_s": round(now - self._started, 1), "models": models}
        if self._ledger is not None:
            body["memory"] = {
                "budget_bytes": self._ledger.budget_bytes(),
                "used_bytes": self._ledger.used_bytes(),
            }
            if self._ledger.inflight is not None:
                body["memory"].update(self._ledger.inflight.figures().to_json())
        if self._cache_disk is not None:
            body["cache_disk_bytes"] = self._cache_disk()
        body["sync"] = dict(self._sync_state()) if self._sync_state is not None else None
        if self._rejected is not None:
            body["rejected"] = self._rejected()
        gpu = self._gpu.read() if self._gpu is not None else []
        if gpu:
            body["gpu"] = [reading.to_json() for reading in gpu]
        return body, samples


def _model(
    name: str, version: int, snap: StatsSnapshot, now: float, previous: tuple[float, int] | None
) -> dict[str, Any]:
    success, fail = snap.stat("success"), snap.stat("fail")
    queue = snap.stat("queue")
    hits, misses = snap.stat("cache_hit").count, snap.stat("cache_miss").count
    rate = None
    if previous is not None:
        then, count = previous
        rate = round((snap.inference_count - count) / max(1e-9, now - then), 2)
    return model_telemetry(
        name,
        version,
        requests=success.count + fail.count,
        failures=fail.count,
        inferences_per_s=rate,
        latency_us=_quantiles_us(snap.summary("request")),
        queue_us={
            "mean": round(queue.ns / queue.count / 1000, 1) if queue.count else None,
            **_quantiles_us(snap.summary("queue")),
        },
        mean_batch_size=(
            round(snap.inference_count / snap.execution_count, 2) if snap.execution_count else None
        ),
        cache_hit_rate=round(hits / (hits + misses), 4) if hits + misses else None,
        pending=snap.pending,
    )


def _slo_sample(name: str, version: int, snap: StatsSnapshot) -> Sample:
    request = dict(snap.summary("request").quantiles)
    queue = snap.stat("queue")
    return Sample(
        model=name,
        version=version,
        success=snap.stat("success").count,
        failure=snap.stat("fail").count,
        p95_us=request.get(0.95, math.nan),
        p99_us=request.get(0.99, math.nan),
        queue_count=queue.count,
        queue_ns=queue.ns,
    )
