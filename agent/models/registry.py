"""Loaded models: (name, version) → backend, with each version's state and reason.

Loading reads the repository layout, completes and checks the config against the model file,
creates one backend per served version and runs its warm-up before the version is marked READY.
A version that fails is UNAVAILABLE with its reason; a model with no READY version is not served.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from agent.backends.base import Backend
from agent.backends.onnx import default_intra_op_threads
from agent.backends.select import (
    BackendKind,
    backend_kind,
    create_backend,
    worker_memory_bytes,
)
from agent.ensemble.plan import build_plan, composing_model_names, is_ensemble
from agent.ensemble.runner import EnsembleScheduler, StepRunnerSlot
from agent.errors import (
    AgentError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from agent.models.memory_plan import Footprint, MemoryLedger, measure_footprint, plan_capacity
from agent.proto import model_config_pb2 as mc
from agent.repository import layout as repository
from agent.repository.autocomplete import DEFAULT_MAX_BATCH_SIZE, complete_config
from agent.repository.model_config import load_model_config
from agent.repository.warmup import warmup_requests
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.rate_limiter import ResourceNeed
from agent.scheduling.scheduler import INLINE_BELOW_NS, LimiterGate, ModelScheduler
from agent.scheduling.statistics import ModelStatistics, StatisticsRegistry
from agent.tensors import datatypes
from agent.tensors.signature import ModelSignature

logger = logging.getLogger(__name__)


class ModelState(str, Enum):
    """Triton's model states as the repository index reports them."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How models are loaded."""

    auto_complete: bool = True
    intra_op_threads: int = 0  # 0: the cores shared between a model's instances
    max_queue_size: int = 1024  # per version, when the config's queue policy sets none
    measure_memory: bool = True  # measure each version's footprint and fit it to the budget
    engine_cache_root: Path | None = None  # where TensorRT engines built on the device are kept


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """A version's state and, when not READY, why."""

    state: ModelState
    reason: str = ""


@dataclass(slots=True)
class LoadedVersion:
    """One READY version: its runtime, its scheduler and what it holds of the memory budget.

    An ensemble has no runtime or executor of its own (None): its scheduler runs its steps on
    the composing models.
    """

    version: int
    backend: Backend | None
    scheduler: ModelScheduler | EnsembleScheduler
    executor: ThreadPoolExecutor | None  # one worker per instance: N executions in flight
    stats: ModelStatistics
    footprint: Footprint | None
    ledger_key: tuple[str, str]

    def close(self) -> None:
        self.scheduler.close()
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        if self.backend is not None:
            self.backend.close()


@dataclass(slots=True)
class ServedModel:
    """A model with at least one READY version."""

    name: str
    config: mc.ModelConfig
    signature: ModelSignature
    versions: dict[int, LoadedVersion]

    @property
    def latest_version(self) -> int:
        return max(self.versions)

    def close(self) -> None:
        for loaded in self.versions.values():
            loaded.close()


@dataclass(slots=True)
class _ModelRecord:
    served: ServedModel | None = None
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    reason: str = ""  # why the whole model is unavailable


def instance_count(config: mc.ModelConfig) -> int:
    """Executions in flight for a model: the sum of its instance groups' counts (default 1)."""
    return max(1, sum(max(1, g.count) for g in config.instance_group))


@dataclass(frozen=True, slots=True)
class ModelBuild:
    """A freshly loaded model, not yet served (or why it could not be loaded)."""

    name: str
    served: ServedModel | None
    record: _ModelRecord
    error: AgentError | None

    @property
    def reason(self) -> str:
        return self.record.reason


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
        self._settings = settings
        self._records: dict[str, _ModelRecord] = {}
        self._lock = threading.Lock()
        self.stats = stats or StatisticsRegistry()
        self.ledger = ledger
        self._gate = gate
        self._generation = 0
        # Ensembles run their steps through the data plane, which binds its `infer` here.
        self.step_runner = StepRunnerSlot()

    @property
    def repository(self) -> Path:
        return self._root

    def load_all(self) -> dict[str, str]:
        """Load every model in the repository; returns {model: reason} for those that failed.

        Ensembles load after the models their steps name, so their plans can be checked.
        """
        failures = {}
        for name in _load_order(self._root, repository.list_models(self._root)):
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
        """Load a model's versions without touching what is served (call from a worker thread).

        Args:
            name: the model's directory in the repository.
            config_override: use this config instead of config.pbtxt (explicit load with a config).
            model_dir: load from this Triton model folder instead of the repository's (a cached
                version about to be activated).

        Returns:
            The build: `served` is None when nothing could be loaded, with the reason and each
            version's status kept for the repository index.

        Raises:
            ModelNotFoundError: no such directory in the repository.
        """
        model_dir = model_dir or self._root / name
        if not model_dir.is_dir():
            raise ModelNotFoundError(f"no model '{name}' in repository {self._root}")
        record = _ModelRecord()
        with self._lock:
            self._generation += 1
            generation = self._generation
        try:
            record.served = self._load(name, model_dir, record, config_override, generation)
        except AgentError as exc:
            record.reason = exc.message
            logger.error("model %s failed to load: %s", name, exc.message, extra={"model": name})
            return ModelBuild(name, None, record, exc)
        return ModelBuild(name, record.served, record, None)

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
                raise ModelNotFoundError(f"unknown model: '{name}'")
            served, record.served = record.served, None
            record.reason = "unloaded"
            record.versions = {
                v: VersionStatus(ModelState.UNAVAILABLE, "unloaded") for v in record.versions
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

    def _load(
        self,
        name: str,
        model_dir: Path,
        record: _ModelRecord,
        config_override: mc.ModelConfig | None,
        generation: int,
    ) -> ServedModel:
        config = config_override if config_override is not None else load_model_config(model_dir)
        if config is None:
            if not self._settings.auto_complete:
                raise ModelConfigError(
                    f"model '{name}': {model_dir}/config.pbtxt is missing and auto-complete is off"
                )
            config = mc.ModelConfig()
        available = repository.list_versions(model_dir)
        wanted = repository.select_versions(config.version_policy, available)
        if is_ensemble(config):
            return self._load_ensemble(name, config, wanted or [1], record, generation)
        if not wanted:
            raise ModelLoadError(f"model '{name}': no version folders (1/, 2/, ...) in {model_dir}")
        loaded: dict[int, LoadedVersion] = {}
        completed: mc.ModelConfig | None = None
        for version in sorted(wanted, reverse=True):  # the newest version completes the config
            record.versions[version] = VersionStatus(ModelState.LOADING)
            try:
                version_config, item = self._load_version(
                    name,
                    model_dir,
                    version,
                    config if completed is None else completed,
                    first=completed is None,
                    generation=generation,
                )
            except AgentError as exc:
                record.versions[version] = VersionStatus(ModelState.UNAVAILABLE, exc.message)
                logger.error(
                    "model %s version %d unavailable: %s",
                    name,
                    version,
                    exc.message,
                    extra={"model": name, "version": version},
                )
                continue
            completed = completed or version_config
            loaded[version] = item
            record.versions[version] = VersionStatus(ModelState.READY, _provider_note(item))
        if completed is None or not loaded:
            reasons = "; ".join(
                f"version {v}: {st.reason}" for v, st in sorted(record.versions.items())
            )
            raise ModelLoadError(f"model '{name}': no version could be loaded ({reasons})")
        return ServedModel(name, completed, ModelSignature.from_config(completed), loaded)

    def _load_ensemble(
        self,
        name: str,
        config: mc.ModelConfig,
        versions: list[int],
        record: _ModelRecord,
        generation: int,
    ) -> ServedModel:
        """An ensemble: its plan checked against the composing models served now."""
        completed = mc.ModelConfig()
        completed.CopyFrom(config)
        if not completed.name:
            completed.name = name
        elif completed.name != name:
            raise ModelConfigError(
                f"config name '{completed.name}' does not match the model directory '{name}'"
            )
        if completed.version_policy.WhichOneof("policy_choice") is None:
            completed.version_policy.latest.num_versions = 1
        plan = build_plan(completed, self._served_config)
        signature = ModelSignature.from_config(completed)
        policy = BatchingPolicy.from_config(completed)
        loaded: dict[int, LoadedVersion] = {}
        for version in versions:
            scheduler = EnsembleScheduler(plan, version, policy, self.step_runner)
            stats = self.stats.get(name, str(version))
            key = (name, f"{version}@{generation}")
            loaded[version] = LoadedVersion(version, None, scheduler, None, stats, None, key)
            record.versions[version] = VersionStatus(ModelState.READY)
        logger.info(
            "ensemble %s ready: %s",
            name,
            " -> ".join(s.model_name for s in plan.steps),
            extra={"model": name},
        )
        return ServedModel(name, completed, signature, loaded)

    def _served_config(self, name: str) -> mc.ModelConfig | None:
        record = self._records.get(name)
        if record is None or record.served is None:
            return None
        return record.served.config

    def _load_version(
        self,
        name: str,
        model_dir: Path,
        version: int,
        config: mc.ModelConfig,
        *,
        first: bool,
        generation: int,
    ) -> tuple[mc.ModelConfig, LoadedVersion]:
        """Load, complete/check, size to the memory budget, warm up and schedule one version."""
        instances = instance_count(config)
        threads = self._settings.intra_op_threads or default_intra_op_threads(instances)
        path = model_dir / str(version) / repository.model_filename(config)
        auto = self._settings.auto_complete and first

        def load() -> tuple[Backend, mc.ModelConfig]:
            backend = create_backend(
                path.parent,
                config,
                threads,
                cache_root=self._settings.engine_cache_root,
                model_name=name,
                version=version,
            )
            try:
                checked = complete_config(
                    config, name, backend.inputs, backend.outputs, auto_complete=auto
                )
            except AgentError:
                backend.close()
                raise
            return backend, checked

        footprint: Footprint | None = None
        python = backend_kind(config) is BackendKind.PYTHON
        if self._settings.measure_memory and self.ledger is not None and not python:
            (backend, completed), footprint = measure_footprint(
                load, _run_zeros, max_batch=config.max_batch_size or DEFAULT_MAX_BATCH_SIZE
            )
            _run_zeros((backend, completed), 1, shrink=True)
        else:
            backend, completed = load()
        # Old and new builds of one version coexist during a swap: each holds its own share.
        key = (name, f"{version}@{generation}")
        try:
            if footprint is not None and self.ledger is not None:
                completed = self._fit_to_budget(completed, footprint, key)
            elif python and self._settings.measure_memory and self.ledger is not None:
                # User code runs in worker processes, never on made-up zeros: the budget holds
                # what the workers are resident with after initialize.
                self.ledger.reserve(key, worker_memory_bytes(backend))
            self._warm_up(completed, model_dir, backend)
        except AgentError:
            backend.close()
            if self.ledger is not None:
                self.ledger.release(key)
            raise
        instances = instance_count(completed)
        executor = ThreadPoolExecutor(instances, thread_name_prefix=f"infer-{name}-{version}")
        stats = self.stats.get(name, str(version))
        policy = BatchingPolicy.from_config(completed)
        scheduler = ModelScheduler(
            model=name,
            version=version,
            backend=backend,
            policy=policy,
            instances=instances,
            executor=executor,
            stats=stats,
            gate=self._gate,
            need=_resource_need(completed, self._gate),
            max_pending=_queue_bound(policy, self._settings.max_queue_size),
            # A Python model's run is a wait on its worker process, cheap in CPU but unbounded
            # when user code hangs: it must never run on the event loop.
            inline_below_ns=0 if backend_kind(completed) is BackendKind.PYTHON else INLINE_BELOW_NS,
        )
        logger.info(
            "model %s version %d ready (providers %s, max batch %d, %d instance(s)%s)",
            name,
            version,
            getattr(backend, "providers", ()),
            completed.max_batch_size,
            instances,
            f", {footprint.bytes_for(max(1, completed.max_batch_size)) >> 20} MiB"
            if footprint
            else "",
            extra={"model": name, "version": version},
        )
        return completed, LoadedVersion(
            version, backend, scheduler, executor, stats, footprint, key
        )

    def _fit_to_budget(
        self, config: mc.ModelConfig, footprint: Footprint, key: tuple[str, str]
    ) -> mc.ModelConfig:
        """Lower the batch cap and instance count so the version fits what is left."""
        assert self.ledger is not None
        instances = instance_count(config)
        plan = plan_capacity(
            footprint,
            budget_left=self.ledger.left(),
            max_batch_size=config.max_batch_size,
            instances=instances,
            budget_bytes=self.ledger.budget_bytes(),
        )
        self.ledger.reserve(key, plan.estimated_bytes)
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
            kept = [
                s for s in fitted.dynamic_batching.preferred_batch_size if s <= plan.max_batch_size
            ]
            del fitted.dynamic_batching.preferred_batch_size[:]
            fitted.dynamic_batching.preferred_batch_size.extend(kept)
        fitted.parameters["edge_agent_memory_plan"].string_value = plan.reason
        logger.warning("model %s version %s: %s", key[0], key[1], plan.reason)
        return fitted

    def _warm_up(self, config: mc.ModelConfig, model_dir: Path, backend: Backend) -> None:
        signature = ModelSignature.from_config(config)
        for sample_name, request, count in warmup_requests(config, model_dir):
            try:
                valid = signature.validate(request)
            except AgentError as exc:
                raise ModelConfigError(f"model_warmup '{sample_name}': {exc.message}") from None
            for _ in range(count):
                backend.run(valid.feeds, valid.output_names)

    def resolve(self, name: str, version: str | None) -> tuple[ServedModel, int]:
        """The model and version a request addresses; no version means the latest READY one.

        Raises:
            ModelNotFoundError: unknown model, or a version that is not a positive integer or not in
                the repository.
            ModelNotReadyError: the model or version exists but is not READY.
        """
        record = self._records.get(name)
        if record is None:
            raise ModelNotFoundError(f"unknown model: '{name}'")
        served = record.served
        if not version:
            if served is None:
                raise ModelNotReadyError(f"model '{name}' is not ready: {record.reason}")
            return served, served.latest_version
        if not version.isdigit():
            raise ModelNotFoundError(f"model '{name}' has no version '{version}'")
        number = int(version)
        if served is not None and number in served.versions:
            return served, number
        status = record.versions.get(number)
        if status is None:
            raise ModelNotFoundError(f"unknown version {number} of model '{name}'")
        raise ModelNotReadyError(
            f"model '{name}' version {number} is not ready: {status.reason or status.state.value}"
        )

    def served_models(self) -> list[ServedModel]:
        """Models that have at least one READY version."""
        return [r.served for r in self._records.values() if r.served is not None]

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every model directory, with each known version's state."""
        names = set(self._records)
        if self._root.is_dir():
            names.update(repository.list_models(self._root))
        rows: list[dict[str, str]] = []
        for name in sorted(names):
            record = self._records.get(name)
            if record is None or (not record.versions and not record.reason):
                rows.append({"name": name})
                continue
            if not record.versions:
                rows.append(
                    {"name": name, "state": ModelState.UNAVAILABLE.value, "reason": record.reason}
                )
            for version, status in sorted(record.versions.items()):
                rows.append(
                    {
                        "name": name,
                        "version": str(version),
                        "state": status.state.value,
                        "reason": status.reason,
                    }
                )
        return rows

    def close(self) -> None:
        """Unload every model."""
        with self._lock:
            records, self._records = list(self._records.values()), {}
        for record in records:
            if record.served is not None:
                self.release(record.served)


def _load_order(root: Path, names: list[str]) -> list[str]:
    """Models first, then ensembles once the models their steps name come before them."""
    steps: dict[str, tuple[str, ...]] = {}
    for name in names:
        try:
            config = load_model_config(root / name)
        except AgentError:
            continue  # reported when the model itself is loaded
        if config is not None and is_ensemble(config):
            steps[name] = composing_model_names(config)
    order = [n for n in names if n not in steps]
    waiting = [n for n in names if n in steps]
    while waiting:
        ready = [n for n in waiting if not any(m in waiting for m in steps[n])]
        if not ready:  # a cycle between ensembles: load them anyway, each will say why
            ready = waiting
        order.extend(ready)
        waiting = [n for n in waiting if n not in ready]
    return order


def _run_zeros(loaded: tuple[Backend, mc.ModelConfig], batch: int, *, shrink: bool = False) -> None:
    """Run the model once on zeros at a batch size, to measure its memory."""
    backend, config = loaded
    signature = ModelSignature.from_config(config)
    batch = min(batch, max(1, config.max_batch_size))
    feeds: dict[str, np.ndarray] = {}
    for contract in signature.inputs.values():
        dims = tuple(1 if d < 0 else d for d in contract.dims)
        shape = (batch, *dims) if signature.batched else dims
        dt = datatypes.from_kserve(contract.datatype)
        assert dt is not None
        if contract.reshape is not None:
            shape = (batch, *contract.reshape) if signature.batched else contract.reshape
            shape = tuple(1 if d < 0 else d for d in shape)
        feeds[contract.name] = (
            np.full(shape, b"", dtype=np.object_)
            if dt.kserve == "BYTES"
            else np.zeros(shape, dt.numpy)
        )
    backend.run(feeds, list(signature.outputs), shrink_memory=shrink)


def _resource_need(config: mc.ModelConfig, gate: LimiterGate | None) -> ResourceNeed:
    """Rate-limiter needs of a model (its first instance group declares them)."""
    if gate is None or not config.instance_group:
        return ResourceNeed()
    need = ResourceNeed.from_group(config.instance_group[0])
    gate.limiter.declare(need)
    return need


def _queue_bound(policy: BatchingPolicy, default: int) -> int:
    configured = policy.default_queue_policy.max_queue_size
    return configured if configured > 0 else default


def _provider_note(loaded: LoadedVersion) -> str:
    """For the index: accelerators the config asked for that this onnxruntime lacks."""
    missing = getattr(loaded.backend, "missing_providers", ())
    if not missing:
        return ""
    used = ", ".join(getattr(loaded.backend, "providers", ()))
    return f"requested execution providers not available: {', '.join(missing)}; running on {used}"
