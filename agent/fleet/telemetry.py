"""What a telemetry message says: per model version and agent-wide figures, and the GPU.

`TelemetrySampler.sample(now)` reads the statistics registry, the memory ledger and the injected
probes, and returns the telemetry body plus the `agent.fleet.slo.Sample`s the SLO evaluator judges.
It keeps the previous counters per model version to turn them into rates; `now` is monotonic
seconds passed in. The probes may do I/O (disk usage, NVML, tegrastats): call `sample` from a
worker thread.

GPU figures come from NVML (through ctypes, so no extra dependency) where `libnvidia-ml.so.1`
loads, else from one line of `tegrastats` on Jetson (whose GPU shares the RAM); otherwise the
`gpu` key is omitted.
"""

from __future__ import annotations

import ctypes
import logging
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agent.fleet.slo import Sample
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.scheduling.statistics import LatencySummary, StatsSnapshot

logger = logging.getLogger(__name__)

_TEGRA_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_TEGRA_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")


class GpuProbe(Protocol):
    """Reads GPU utilisation and memory; None when it cannot."""

    def read(self) -> list[dict[str, int]] | None: ...


class _Utilization(ctypes.Structure):
    _fields_ = (("gpu", ctypes.c_uint), ("memory", ctypes.c_uint))


class _Memory(ctypes.Structure):
    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class NvmlProbe:
    """NVML through ctypes: utilisation and memory of every GPU."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib

    @classmethod
    def open(cls) -> NvmlProbe | None:
        """Load and initialise NVML; None where there is no NVIDIA driver."""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def read(self) -> list[dict[str, int]] | None:
        """One entry per GPU: index, util_percent, memory_used_bytes, memory_total_bytes."""
        count = ctypes.c_uint()
        if self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            util, mem = _Utilization(), _Memory()
            if (
                self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                or self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0
            ):
                return None
            busy = self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
            entry = {
                "index": index,
                "memory_used_bytes": int(mem.used),
                "memory_total_bytes": int(mem.total),
            }
            if busy:
                entry["util_percent"] = int(util.gpu)
            gpus.append(entry)
        return gpus


class TegrastatsProbe:
    """Jetson: one line of `tegrastats` (GPU load, and the RAM the GPU shares)."""

    def __init__(self, command: str) -> None:
        self._command = command

    @classmethod
    def open(cls) -> TegrastatsProbe | None:
        """None where `tegrastats` is not on the PATH."""
        found = shutil.which("tegrastats")
        return cls(found) if found else None

    def read(self) -> list[dict[str, int]] | None:
        """Run tegrastats until its first line (bounded to 5 s) and parse it."""
        try:
            with subprocess.Popen(
                [self._command, "--interval", "500"], stdout=subprocess.PIPE, text=True
            ) as proc:
                try:
                    line = proc.stdout.readline() if proc.stdout else ""
                finally:
                    proc.kill()
        except OSError as exc:
            logger.debug("tegrastats failed: %s", exc)
            return None
        parsed = parse_tegrastats(line)
        return [parsed] if parsed else None


def parse_tegrastats(line: str) -> dict[str, int] | None:
    """GPU load and shared memory from a tegrastats line; None if it has no GR3D_FREQ."""
    gpu = _TEGRA_GPU.search(line)
    if gpu is None:
        return None
    entry = {"index": 0, "util_percent": int(gpu.group(1))}
    ram = _TEGRA_RAM.search(line)
    if ram is not None:
        entry["memory_used_bytes"] = int(ram.group(1)) << 20
        entry["memory_total_bytes"] = int(ram.group(2)) << 20
    return entry


def detect_gpu() -> GpuProbe | None:
    """NVML, else tegrastats, else None."""
    return NvmlProbe.open() or TegrastatsProbe.open()


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
        gpu: A GPU probe (None: the `gpu` key is omitted).
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
        gpu: GpuProbe | None = None,
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
        if self._cache_disk is not None:
            body["cache_disk_bytes"] = self._cache_disk()
        body["sync"] = dict(self._sync_state()) if self._sync_state is not None else None
        if self._rejected is not None:
            body["rejected"] = self._rejected()
        gpu = self._gpu.read() if self._gpu is not None else None
        if gpu:
            body["gpu"] = gpu
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
    return {
        "model": name,
        "version": version,
        "requests": success.count + fail.count,
        "failures": fail.count,
        "inferences_per_s": rate,
        "latency_us": _quantiles_us(snap.summary("request")),
        "queue_us": {
            "mean": round(queue.ns / queue.count / 1000, 1) if queue.count else None,
            **_quantiles_us(snap.summary("queue")),
        },
        "mean_batch_size": (
            round(snap.inference_count / snap.execution_count, 2) if snap.execution_count else None
        ),
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "pending": snap.pending,
    }


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
