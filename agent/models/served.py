"""What the registry holds: each model's versions, their states and reasons, and one build.

Plain data shared by the state table (`agent.models.registry`) and the loading pipeline
(`agent.models.loader`); neither owns the other's types.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from agent.backends.base import Backend, ReportsHealth
from agent.backends.health import HealthState
from agent.errors import AgentError
from agent.models.memory_plan import Footprint
from agent.proto import model_config_pb2 as mc
from agent.scheduling.protocol import Scheduler
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.signature import ModelSignature


class ModelState(str, Enum):
    """Triton's model states as the repository index reports them."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """A version's state and, when not READY, why."""

    state: ModelState
    reason: str = ""


@dataclass(slots=True)
class LoadedVersion:
    """One loaded version: its runtime, its scheduler and what it holds of the memory budget.

    An ensemble has no runtime or executor of its own (None): its scheduler runs its steps on
    the composing models. `monitor` is its backend when that reports the health of its
    instances (`ReportsHealth`, resolved once at load): the version serves while it says ready.
    """

    version: int
    backend: Backend | None
    scheduler: Scheduler  # the dynamic or sequence batcher, or an ensemble's runner
    executor: ThreadPoolExecutor | None  # one worker per instance: N executions in flight
    stats: ModelStatistics
    footprint: Footprint | None
    ledger_key: tuple[str, str]
    monitor: ReportsHealth | None = None
    fallback: str = ""  # the accelerators it runs without (models.allow_cpu_fallback), if any

    @property
    def build_id(self) -> str:
        """`VERSION@GENERATION`: a rebuild of the same version number gets a new one."""
        return self.ledger_key[1]

    @property
    def ready(self) -> bool:
        """Whether an instance serves now (always, for a backend that reports no health)."""
        monitor = self.monitor
        return monitor is None or monitor.health.ready

    @property
    def health(self) -> HealthState | None:
        """Its instances' health now (None: its backend reports none)."""
        return self.monitor.health if self.monitor is not None else None

    def close(self) -> None:
        self.scheduler.close()
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        if self.backend is not None:
            self.backend.close()


@dataclass(slots=True)
class ServedModel:
    """A model with at least one loaded version (READY while an instance of it serves)."""

    name: str
    config: mc.ModelConfig
    signature: ModelSignature
    versions: dict[int, LoadedVersion]
    source: Path | None = None  # the model folder it was loaded from (to load it again)

    @property
    def latest_version(self) -> int:
        return max(self.versions)

    def close(self) -> None:
        for loaded in self.versions.values():
            loaded.close()


@dataclass(slots=True)
class ModelRecord:
    """One model's row in the registry: what is served, and every known version's state."""

    served: ServedModel | None = None
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    reason: str = ""  # why the whole model is unavailable


@dataclass(frozen=True, slots=True)
class ModelBuild:
    """A freshly loaded model, not yet served (or why it could not be loaded)."""

    name: str
    served: ServedModel | None
    record: ModelRecord
    error: AgentError | None

    @property
    def reason(self) -> str:
        return self.record.reason
