"""The registry: which versions of which models are served, and why the others are not.

A state table keyed by model name. `commit` makes a build (from `agent.models.loader`) what is
served in one reference swap; `resolve` answers which version a request addresses; `index` is
Triton's repository index; `mark_failed`, `unload` and `release` take versions out of service.
Loading itself is the loader's job; `build`, `load_model` and `load_all` hand it on.

Readiness follows the instances: a loaded version whose backend reports its health
(`ReportsHealth`: Python workers, ONNX Runtime and TensorRT sessions) is READY while one of its
instances serves. While none does (restarting after a failure) `resolve` refuses it and `index`
shows it UNAVAILABLE with the reason; once an instance is back it is READY again, without
anyone reloading it. A version that gave up (its restart limit) is taken out of service with
`mark_failed`, on the event loop. Every change of an instance is an event (`events`).
`all_ready` is the server's readiness under Triton's strict readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from pathlib import Path

from agent.backends.health import ChangeKind, HealthChange
from agent.errors import (
    AgentError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NoReadyVersionError,
)
from agent.models.ensemble_load import load_order
from agent.models.events import EventSink, guarded
from agent.models.loader import LoadSettings, ModelLoader
from agent.models.memory_plan import MemoryLedger
from agent.models.served import (
    LoadedVersion,
    ModelBuild,
    ModelRecord,
    ModelState,
    ServedModel,
    VersionStatus,
)
from agent.proto import model_config_pb2 as mc
from agent.repository import layout as repository
from agent.scheduling.scheduler import LimiterGate
from agent.scheduling.statistics import StatisticsRegistry

logger = logging.getLogger(__name__)

_INTEGER = re.compile(r"[+-]?[0-9]+")
UNLOADED = "unloaded"  # the reason of a version unloaded on purpose (Triton's word)

__all__ = [
    "LoadSettings",
    "LoadedVersion",
    "ModelBuild",
    "ModelRegistry",
    "ModelState",
    "ServedModel",
    "VersionStatus",
]


class ModelRegistry:
    """Owns the loaded models of one repository."""

    def __init__(
        self,
        repository_path: Path,
        settings: LoadSettings,
        *,
        stats: StatisticsRegistry | None = None,
        ledger: MemoryLedger | None = None,
        gate: LimiterGate | None = None,
    ) -> None:
        self._root = repository_path
        self._records: dict[str, ModelRecord] = {}
        self._lock = threading.Lock()
        self.stats = stats or StatisticsRegistry()
        self.ledger = ledger
        # Where instance events go (the daemon sets the agent's tee: log, cache, fleet, page).
        self.events: EventSink = guarded(None)
        # The event loop versions that gave up are taken out of service on (`bind_loop`).
        self._loop: asyncio.AbstractEventLoop | None = None
        self.loader = ModelLoader(
            repository_path,
            settings,
            stats=self.stats,
            ledger=ledger,
            gate=gate,
            served_config=self._served_config,
            served_versions=self._served_versions,
            on_health=self.health_changed,
        )
        # Ensembles run their steps through the data plane, which binds its `infer` here.
        self.step_runner = self.loader.step_runner

    @property
    def repository(self) -> Path:
        return self._root

    def load_all(self) -> dict[str, str]:
        """Load every model in the repository; returns {model: reason} for those that failed.

        Ensembles load after the models their steps name, so their plans can be checked.
        """
        failures = {}
        for name in load_order(self._root, repository.list_models(self._root)):
            try:
                self.load_model(name)
            except AgentError as exc:
                failures[name] = exc.message
        return failures

    def load_model(self, name: str, config_override: mc.ModelConfig | None = None) -> ServedModel:
        """Load (or reload) a model and serve it at once; the old one is closed without draining.

        For start-up and tests; a running agent swaps through `build`, `commit` and `release`.

        Raises:
            ModelNotFoundError, ModelConfigError, ModelLoadError: see `build`.
        """
        build = self.build(name, config_override)
        old = self.commit(build)
        if old is not None:
            self.release(old)
        if build.served is None:
            raise build.error or ModelLoadError(build.reason)
        return build.served

    def build(
        self,
        name: str,
        config_override: mc.ModelConfig | None = None,
        model_dir: Path | None = None,
    ) -> ModelBuild:
        """Load a model without touching what is served (see `ModelLoader.build`).

        Raises:
            ModelNotFoundError: no such directory in the repository.
        """
        return self.loader.build(name, config_override, model_dir)

    def commit(self, build: ModelBuild) -> ServedModel | None:
        """Make a build what is served (one reference swap); returns the replaced model.

        A failed build leaves the old model serving; its version failures join the index.
        """
        with self._lock:
            old = self._records.get(build.name)
            if build.served is None and old is not None and old.served is not None:
                for version, status in build.record.versions.items():
                    if version not in old.served.versions:
                        old.versions[version] = status
                return None
            if old is not None:
                _carry_unloaded(old, build.record)
            self._records[build.name] = build.record
        return old.served if old is not None else None

    def unload(self, name: str) -> ServedModel | None:
        """Stop serving a model; returns it for draining and `release`.

        Raises:
            ModelNotFoundError: the model is not known.
        """
        with self._lock:
            record = self._records.get(name)
            if record is None:
                raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
            served, record.served = record.served, None
            record.reason = UNLOADED
            record.versions = {
                v: VersionStatus(ModelState.UNAVAILABLE, UNLOADED) for v in record.versions
            }
        return served

    def release(self, served: ServedModel) -> None:
        """Close a model that is no longer served (after draining) and give back its memory."""
        served.close()
        with self._lock:
            current = self._records.get(served.name)
            live = set(current.served.versions) if current and current.served else set()
        for loaded in served.versions.values():
            if self.ledger is not None:
                self.ledger.release(loaded.ledger_key)
            if loaded.version not in live:
                self.stats.remove(served.name, str(loaded.version))

    def mark_failed(
        self, name: str, version: int, reason: str, *, loaded: LoadedVersion | None = None
    ) -> bool:
        """Take a served version out of service: UNAVAILABLE with `reason` (call on the loop).

        The model stops being served when no version is left. Queued requests of the version
        fail; its backend is closed and its memory given back in a thread, off the event loop.
        With `loaded`, only that build is taken out (not a newer one that replaced it).

        Returns:
            Whether the version was served (False: already out, or replaced meanwhile).
        """
        with self._lock:
            record = self._records.get(name)
            served = record.served if record is not None else None
            current = served.versions.get(version) if served is not None else None
            if record is None or served is None or current is None:
                return False
            if loaded is not None and current is not loaded:
                return False
            del served.versions[version]
            record.versions[version] = VersionStatus(ModelState.UNAVAILABLE, reason)
            if not served.versions:
                record.served = None
                record.reason = reason
        logger.error(
            "model %s version %d unavailable: %s",
            name,
            version,
            reason,
            extra={"model": name, "version": version},
        )
        current.scheduler.close(f"version {version} is unavailable: {reason}")
        threading.Thread(
            target=self._retire, args=(name, current), name=f"retire-{name}-{version}", daemon=True
        ).start()
        return True

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop `mark_failed` runs on when a version gives up (from another thread)."""
        self._loop = loop

    def health_changed(self, name: str, version: int, build: str, change: HealthChange) -> None:
        """An instance of a build failed, came back, or the build gave up (a backend thread).

        Every change is an event; a build that gave up is taken out of service on the loop
        (`mark_failed`), the other versions and models serving on.
        """
        self.events.record(name, version, change.kind.value, change.detail())
        if change.kind is not ChangeKind.GAVE_UP:
            return
        record = self._records.get(name)
        served = record.served if record is not None else None
        loaded = served.versions.get(version) if served is not None else None
        if loaded is None or loaded.build_id != build:
            return  # not served (yet, or any more): its backend holds nothing that serves
        if self._loop is None:
            self.mark_failed(name, version, change.reason, loaded=loaded)
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the agent stops, releasing it
            self._loop.call_soon_threadsafe(
                lambda: self.mark_failed(name, version, change.reason, loaded=loaded)
            )

    def _retire(self, name: str, loaded: LoadedVersion) -> None:
        loaded.close()  # executions on the other instances finish first
        if self.ledger is not None:
            self.ledger.release(loaded.ledger_key)
        self.stats.remove(name, str(loaded.version))

    def reserved_bytes(self, name: str) -> int:
        """Memory the served versions of a model hold in the budget (0 if not loaded)."""
        record = self._records.get(name)
        if record is None or record.served is None or self.ledger is None:
            return 0
        held = self.ledger.reserved()
        return sum(held.get(v.ledger_key, 0) for v in record.served.versions.values())

    def _served_config(self, name: str) -> mc.ModelConfig | None:
        record = self._records.get(name)
        if record is None or record.served is None:
            return None
        return record.served.config

    def _served_versions(self, name: str) -> tuple[int, ...] | None:
        record = self._records.get(name)
        if record is None or record.served is None:
            return None
        return tuple(record.served.versions)

    def resolve(self, name: str, version: str | None) -> tuple[ServedModel, int]:
        """The model and version a request addresses; no version means the latest READY one.

        Messages are Triton's for the same case ("Request for unknown model: ..."), the agent's
        reason after them.

        Raises:
            InvalidInputError: the version is not an integer, or is negative.
            ModelNotFoundError: unknown model, or a version not in the repository.
            NoReadyVersionError: no version given and none is READY.
            ModelNotReadyError: the version exists but is not READY.
        """
        number = parse_version(version)
        record = self._records.get(name)
        if record is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        served = record.served
        if served is None and not record.versions:
            # Its config failed before any version was read: Triton knows no such model.
            raise NoReadyVersionError(
                f"Request for unknown model: '{name}' is not found: {record.reason or 'not loaded'}"
            )
        if number is None:
            if served is None:
                raise NoReadyVersionError(
                    f"Request for unknown model: '{name}' has no available versions: "
                    f"{record.reason or 'not loaded'}"
                )
            latest = served.latest_version
            if served.versions[latest].ready:
                return served, latest
            return served, _newest_ready(served)
        if served is not None and number in served.versions:
            loaded = served.versions[number]
            if loaded.ready:
                return served, number
            raise ModelNotReadyError(
                f"Request for unknown model: '{name}' version {number} is not at ready state: "
                f"{_health_reason(loaded)}"
            )
        status = record.versions.get(number)
        if status is None:
            raise ModelNotFoundError(
                f"Request for unknown model: '{name}' version {number} is not found"
            )
        raise ModelNotReadyError(
            f"Request for unknown model: '{name}' version {number} is not at ready state: "
            f"{status.reason or status.state.value}"
        )

    def served_models(self) -> list[ServedModel]:
        """Models that have at least one loaded version (`ready_versions`: which serve now)."""
        return [r.served for r in self._records.values() if r.served is not None]

    def cpu_fallbacks(self) -> dict[tuple[str, int], str]:
        """(model, version) of each loaded version that runs without accelerators its config
        asked for (models.allow_cpu_fallback): what it runs without, and on what."""
        return {
            (served.name, number): loaded.fallback
            for served in self.served_models()
            for number, loaded in served.versions.items()
            if loaded.fallback
        }

    def all_ready(self) -> bool:
        """Triton's strict readiness: every model the registry knows has a version, and each of
        its versions is READY (an instance serving) or was unloaded on purpose. A model that
        failed to load, a version that failed or gave up, or one restarting, is not."""
        for record in list(self._records.values()):
            if not record.versions:
                if record.reason != UNLOADED:
                    return False
                continue
            served = record.served
            for number, status in list(record.versions.items()):
                if status.state is not ModelState.READY:
                    if status.reason != UNLOADED:
                        return False
                    continue
                loaded = served.versions.get(number) if served is not None else None
                if loaded is None or not loaded.ready:
                    return False
        return True

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every model directory, with each known version's state.

        A model that serves nothing and whose folder left the repository is not listed (as in
        Triton; a request naming it still hears it has no available versions)."""
        on_disk = set(repository.list_models(self._root)) if self._root.is_dir() else set()
        rows: list[dict[str, str]] = []
        for name in sorted(on_disk | set(self._records)):
            record = self._records.get(name)
            if record is not None and record.served is None and name not in on_disk:
                continue
            if record is None or (not record.versions and not record.reason):
                rows.append({"name": name})
                continue
            if not record.versions:
                rows.append(
                    {"name": name, "state": ModelState.UNAVAILABLE.value, "reason": record.reason}
                )
            served = record.served
            for version, status in sorted(record.versions.items()):
                state, reason = status.state, status.reason
                loaded = served.versions.get(version) if served is not None else None
                if state is ModelState.READY and loaded is not None:
                    state, reason = _live_status(loaded, reason)
                rows.append(
                    {"name": name, "version": str(version), "state": state.value, "reason": reason}
                )
        return rows

    def close(self) -> None:
        """Unload every model."""
        with self._lock:
            records, self._records = list(self._records.values()), {}
        for record in records:
            if record.served is not None:
                self.release(record.served)


def _carry_unloaded(old: ModelRecord, new: ModelRecord) -> None:
    """Versions the old record knew and a reload no longer loads stay in the new one: those
    that served as UNAVAILABLE "unloaded", failed ones as they were. Triton keeps each version
    it ever tracked in the index, and answers a request naming one "not at ready state"."""
    for version, status in old.versions.items():
        if version in new.versions:
            continue
        done = status.state in (ModelState.READY, ModelState.LOADING)
        new.versions[version] = VersionStatus(ModelState.UNAVAILABLE, UNLOADED) if done else status


def _health_reason(loaded: LoadedVersion) -> str:
    health = loaded.health
    return health.reason if health is not None else ""


def _live_status(loaded: LoadedVersion, note: str) -> tuple[ModelState, str]:
    """A loaded version's row as its instances make it: UNAVAILABLE while none serves, READY
    with the instances that are down (and its own note, a CPU fallback) otherwise."""
    health = loaded.health
    if health is None:
        return ModelState.READY, note
    if not health.ready:
        return ModelState.UNAVAILABLE, health.reason
    return ModelState.READY, "; ".join(t for t in (health.reason, note) if t)


def _newest_ready(served: ServedModel) -> int:
    """The newest version an instance of which serves now.

    Raises:
        NoReadyVersionError: none does (Triton's words, with why).
    """
    for number in sorted(served.versions, reverse=True):
        if served.versions[number].ready:
            return number
    reasons = "; ".join(
        f"version {n}: {_health_reason(v)}" for n, v in sorted(served.versions.items())
    )
    raise NoReadyVersionError(
        f"Request for unknown model: '{served.name}' has no available versions: {reasons}"
    )


def parse_version(text: str | None) -> int | None:
    """A request's version string as Triton reads it: None (latest) when empty, else >= 0.

    Raises:
        InvalidInputError: not an integer, or negative (Triton's two messages, INVALID_ARG).
    """
    if not text:
        return None
    if not _INTEGER.fullmatch(text):
        # "stol" is what Triton's message carries here (the C++ call that refused the text).
        raise InvalidInputError(
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        )
    number = int(text)
    if number < 0:
        raise InvalidInputError(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return number
