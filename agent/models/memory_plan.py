"""The agent's memory budget, what a model costs in it, and the capacity that fits.

* `detect_budget_bytes` reads the budget once at start-up: configured, else the cgroup limit,
  else a share of RAM. File paths and RAM size are parameters, so tests use fake files.
* `measure_footprint` measures RSS growth from loading a model and running it at batch 1 and at
  its max batch, with the RSS reader injected.
* `plan_capacity` (pure) picks the batch cap and instance count that fit in what is left.
* `MemoryLedger` (thread-safe) holds the budget and each loaded (model, version)'s reservation,
  and the pool kept for requests in flight (`agent.models.inflight`), reserved before any model.

Invariants: a `Footprint` never shrinks with the batch size and never goes negative; a
`CapacityPlan` never exceeds the budget left it was planned against; the ledger never lets
reservations add up to more than its budget.

RSS covers what the CPU allocator maps. On Jetson, CUDA and TensorRT allocations come from the
same physical RAM but mostly do not show in RSS, so footprints of GPU models are lower bounds.
On a discrete GPU, device memory is checked apart from this budget, against the GPU's free
memory, before a GPU version loads (`agent.models.device_memory`).
The budget is for models: the caller reserves the agent's own baseline RSS in the ledger.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeVar

import psutil

from agent.errors import MemoryBudgetError
from agent.models.inflight import InflightBytes, default_capacity
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import instance_count

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
ModelKey: TypeAlias = tuple[str, str]  # (model name, version)
AGENT_KEY = "edge-agent"  # the agent's own reservations: its base memory, requests in flight
INFLIGHT_KEY: ModelKey = (AGENT_KEY, "in flight")

MIB = 1 << 20
_V1_UNLIMITED = 1 << 62  # cgroup v1 says "no limit" with LONG_MAX rounded down to a page


def detect_budget_bytes(
    configured: int | None,
    *,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    total_ram: int | None = None,
    share: float = 0.8,
) -> tuple[int, str]:
    """The agent's memory budget and where it came from.

    Order: the configured value; else the lowest cgroup limit on this process's cgroup path
    (v2 `memory.max`, then v1 `memory.limit_in_bytes`, each checked on the cgroup and its
    ancestors, so a container whose cgroup namespace hides the path still finds its root file);
    else `share` of the RAM. "max", v1's near-2**63 values and limits not below the RAM mean
    unlimited. Unreadable files count as no limit.

    Args:
        configured: the budget from the config, or None to detect it.
        cgroup_root: where the cgroup file system is mounted.
        proc_self_cgroup: this process's cgroup membership file.
        total_ram: the RAM size; None reads it with psutil.
        share: the share of RAM to use when no limit is found, in (0, 1].

    Raises:
        ValueError: a configured budget that is not positive, or a share outside (0, 1].

    Returns:
        (bytes, source), source being "config", "cgroup memory.max",
        "cgroup memory.limit_in_bytes" or e.g. "80% of RAM".
    """
    if not 0 < share <= 1:
        raise ValueError(f"RAM share must be in (0, 1], got {share}")
    if configured is not None:
        if configured <= 0:
            raise ValueError(f"configured memory budget must be positive, got {configured}")
        return configured, "config"
    ram = total_ram if total_ram is not None else psutil.virtual_memory().total
    found = _cgroup_limit(cgroup_root, proc_self_cgroup)
    if found is not None:
        limit, source = found
        if limit < ram:
            return limit, source
        logger.info("%s of %d bytes is not below the RAM (%d bytes); ignored", source, limit, ram)
    return int(ram * share), f"{share:.0%} of RAM"


def process_rss_bytes() -> int:
    """This process's resident set size in bytes."""
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True, slots=True)
class Footprint:
    """A model instance's memory at two batch sizes; linear in between and beyond."""

    bytes_at_batch_1: int
    bytes_at_max_batch: int
    max_batch: int  # the batch size bytes_at_max_batch was measured at

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not 0 <= self.bytes_at_batch_1 <= self.bytes_at_max_batch:
            raise ValueError(f"need 0 <= bytes_at_batch_1 <= bytes_at_max_batch: {self}")

    @property
    def per_row_bytes(self) -> float:
        """Bytes each extra row of a batch adds; 0 when only batch 1 was measured."""
        if self.max_batch == 1:
            return 0.0
        return (self.bytes_at_max_batch - self.bytes_at_batch_1) / (self.max_batch - 1)

    def bytes_for(self, batch: int) -> int:
        """The estimated bytes at a batch size (>= 1, else ValueError), rounded up.

        Above `max_batch` the line is extrapolated.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if self.max_batch == 1:
            return self.bytes_at_batch_1
        growth = (self.bytes_at_max_batch - self.bytes_at_batch_1) * (batch - 1)
        return self.bytes_at_batch_1 + -(-growth // (self.max_batch - 1))


def measure_footprint(
    load: Callable[[], _T],
    run: Callable[[_T, int], None],
    max_batch: int,
    rss: Callable[[], int] = process_rss_bytes,
    *,
    repeats: int = 3,
) -> tuple[_T, Footprint]:
    """Load a model and measure how much the process grew, at batch 1 and at max_batch.

    RSS is read before `load`, after each of `repeats` runs at batch 1 (the highest reading
    counts: allocators and arenas settle over the first runs) and after one run at `max_batch`.
    Growth below zero (memory returned to the system meanwhile) counts as zero, and the max-batch
    figure is never below the batch-1 one. Other threads allocating meanwhile inflate the figures,
    so measure while the agent is otherwise quiet; errors from `load` or `run` propagate.

    Args:
        load: creates the model instance (e.g. a backend).
        run: runs the instance once at the given batch size.
        max_batch: the largest batch size to measure.
        rss: reads the process's resident set size.
        repeats: runs at batch 1.

    Raises:
        ValueError: max_batch or repeats below 1.

    Returns:
        The loaded instance and its footprint.
    """
    if max_batch < 1 or repeats < 1:
        raise ValueError(f"max_batch and repeats must be >= 1, got {max_batch} and {repeats}")
    before = rss()
    model = load()
    at_1 = before
    for _ in range(repeats):
        run(model, 1)
        at_1 = max(at_1, rss())
    at_max = at_1
    if max_batch > 1:
        run(model, max_batch)
        at_max = max(at_1, rss())
    return model, Footprint(at_1 - before, at_max - before, max_batch)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The batch cap and instance count a model gets, and why."""

    max_batch_size: int  # 0 for a model that does not batch
    instances: int
    estimated_bytes: int
    reason: str  # for logs


def plan_capacity(
    footprint: Footprint,
    *,
    budget_left: int,
    max_batch_size: int,
    instances: int,
    budget_bytes: int | None = None,
    extra_runs: int = 0,
) -> CapacityPlan:
    """The largest batch cap and instance count whose estimate fits in the budget left.

    Estimate: `(instances + extra_runs) * footprint.bytes_for(batch cap)`. ONNX Runtime's
    instances share one session, but each run in flight holds its own activations in its arena,
    so each instance is counted whole; a lone-run session (agent.backends.onnx) is one run more.
    The weights are counted once per run although they are loaded once or twice: the safe side
    on a device.

    The batch cap is kept in preference to instances: instances are lowered first (down to 1),
    and only then the batch cap. A model that does not batch (max_batch_size 0) is costed at
    batch 1 and keeps max_batch_size 0.

    Args:
        footprint: one instance's measured footprint.
        budget_left: bytes of the budget not reserved yet.
        max_batch_size: the config's batch cap; 0 when the model does not batch.
        instances: the configured instance count, >= 1.
        extra_runs: runs the runtime holds memory for beyond one per instance, >= 0.
        budget_bytes: the whole budget, only to word the error.

    Raises:
        ValueError: max_batch_size below 0 or instances below 1.
        MemoryBudgetError: even one instance at batch 1 does not fit.

    Returns:
        The plan.
    """
    if max_batch_size < 0 or instances < 1 or extra_runs < 0:
        raise ValueError(
            f"bad max_batch_size {max_batch_size}, instances {instances} or extra_runs {extra_runs}"
        )
    need = footprint.bytes_for(1) * (1 + extra_runs)
    if need > budget_left:
        of = f" of the {_mib(budget_bytes)} budget" if budget_bytes is not None else ""
        raise MemoryBudgetError(
            f"needs {_mib(need)} at batch 1, {_mib(max(budget_left, 0))} left{of}"
        )
    top = max(1, max_batch_size)
    runs = 1 + extra_runs
    batch = next(b for b in range(top, 0, -1) if footprint.bytes_for(b) * runs <= budget_left)
    per_instance = footprint.bytes_for(batch)
    fits = budget_left // per_instance - extra_runs if per_instance else instances
    count = min(instances, fits)
    estimate = (count + extra_runs) * per_instance
    changes = [f"batch cap lowered from {top} to {batch}"] if batch < top else []
    if count < instances:
        changes.append(f"instances lowered from {instances} to {count}")
    fit = f"{' and '.join(changes)} to fit" if changes else "fits as configured in"
    reason = f"{fit} {_mib(budget_left)} left (estimate {_mib(estimate)})"
    return CapacityPlan(
        max_batch_size=batch if max_batch_size > 0 else 0,
        instances=count,
        estimated_bytes=estimate,
        reason=reason,
    )


class MemoryLedger:
    """The budget and the bytes each loaded (model, version) reserved. Thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        """Create an empty ledger over a budget of `budget_bytes` (>= 0, else ValueError)."""
        if budget_bytes < 0:
            raise ValueError(f"memory budget must be >= 0, got {budget_bytes}")
        self._budget = budget_bytes
        self._reserved: dict[ModelKey, int] = {}
        self._lock = threading.Lock()
        # Requests in flight: set by `keep_for_inflight` (None: nothing is counted, as in tools
        # and tests that plan models alone).
        self.inflight: InflightBytes | None = None

    def keep_for_inflight(self, nbytes: int) -> InflightBytes:
        """Reserve the pool for requests in flight and return it (`agent.models.inflight`).

        Args:
            nbytes: the pool's size; 0: `inflight.default_capacity` of what is left.

        Raises:
            MemoryBudgetError: a configured size that does not fit in what is left.
        """
        size = nbytes or default_capacity(self._budget, self.left())
        self.reserve(INFLIGHT_KEY, size)
        self.inflight = InflightBytes(size)
        return self.inflight

    def budget_bytes(self) -> int:
        """The whole budget."""
        return self._budget

    def used_bytes(self) -> int:
        """Bytes reserved in total."""
        with self._lock:
            return sum(self._reserved.values())

    def models_bytes(self) -> int:
        """Bytes the loaded model versions' plans reserved (the agent's own keys left out)."""
        with self._lock:
            return sum(n for key, n in self._reserved.items() if key[0] != AGENT_KEY)

    def left(self) -> int:
        """Bytes not reserved yet."""
        with self._lock:
            return self._budget - sum(self._reserved.values())

    def reserved(self) -> dict[ModelKey, int]:
        """A snapshot of the reservations."""
        with self._lock:
            return dict(self._reserved)

    def reserve(self, key: ModelKey, nbytes: int) -> None:
        """Reserve bytes for a model version; replaces that key's earlier reservation.

        Check and reservation happen under one lock, so two loads cannot both take the last bytes.

        Args:
            key: (model name, version).
            nbytes: bytes to hold, >= 0.

        Raises:
            ValueError: negative bytes.
            MemoryBudgetError: the reservation does not fit in what is left.
        """
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        with self._lock:
            left = self._budget - sum(self._reserved.values()) + self._reserved.get(key, 0)
            if nbytes > left:
                raise MemoryBudgetError(
                    f"model '{key[0]}' version {key[1]} needs {_mib(nbytes)}, "
                    f"{_mib(left)} left of the {_mib(self._budget)} budget"
                )
            self._reserved[key] = nbytes

    def release(self, key: ModelKey) -> int:
        """Give a (model, version)'s bytes back; returns them, 0 when it held none."""
        with self._lock:
            return self._reserved.pop(key, 0)


def _cgroup_limit(root: Path, proc_self_cgroup: Path) -> tuple[int, str] | None:
    try:
        membership = proc_self_cgroup.read_text()
    except OSError:
        return None
    v2_path: str | None = None
    v1_path: str | None = None
    for line in membership.splitlines():  # "hierarchy-id:controllers:path"
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hierarchy == "0" and not controllers:
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    for found, base, filename in (
        (v2_path, root, "memory.max"),
        (v1_path, root / "memory", "memory.limit_in_bytes"),
    ):
        limit = None if found is None else _lowest_limit(base, found, filename)
        if limit is not None:
            return limit, f"cgroup {filename}"
    return None


def _lowest_limit(base: Path, cgroup_path: str, filename: str) -> int | None:
    """The lowest limit set on the cgroup or any of its ancestors under base."""
    parts = [p for p in cgroup_path.split("/") if p and p != ".."]
    limits = []
    for depth in range(len(parts), -1, -1):
        limit = _read_limit(base.joinpath(*parts[:depth]) / filename)
        if limit is not None:
            limits.append(limit)
    return min(limits, default=None)


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        logger.warning("ignoring %s: %r is not a byte count", path, text)
        return None
    return None if value >= _V1_UNLIMITED or value < 0 else value


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f}".removesuffix(".0") + " MiB"


def fit_config(config: mc.ModelConfig, plan: CapacityPlan) -> mc.ModelConfig:
    """The config with the plan's batch cap and instance count (the same object when unchanged).

    Preferred batch sizes above the new cap are dropped; the plan's reason is recorded in the
    `edge_agent_memory_plan` parameter so the model's config shows why it was lowered.
    """
    instances = instance_count(config)
    if plan.max_batch_size == config.max_batch_size and plan.instances == instances:
        return config
    fitted = mc.ModelConfig()
    fitted.CopyFrom(config)
    fitted.max_batch_size = plan.max_batch_size
    if plan.instances != instances:
        group = mc.ModelInstanceGroup()
        group.CopyFrom(fitted.instance_group[0])
        group.count = plan.instances
        del fitted.instance_group[:]
        fitted.instance_group.append(group)
    if fitted.HasField("dynamic_batching"):
        kept = [s for s in fitted.dynamic_batching.preferred_batch_size if s <= plan.max_batch_size]
        del fitted.dynamic_batching.preferred_batch_size[:]
        fitted.dynamic_batching.preferred_batch_size.extend(kept)
    fitted.parameters["edge_agent_memory_plan"].string_value = plan.reason
    return fitted
