"""Loading a model: read its folder, build each version, fit it to the memory budget, warm it up.

`ModelLoader.build` turns a model folder into a `ModelBuild` without touching what is served;
the registry (`agent.models.registry`) commits it. Each version is loaded into its runtime, its
config completed and checked against the model file, sized to what is left of the memory budget
(`fit_config`, pure), warmed up, and given a scheduler. A version that fails is UNAVAILABLE with
its reason; any failure, expected or not, stays with that model and never stops the agent.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from agent.backends.base import (
    Backend,
    CountsExtraRuns,
    DeclaresConfig,
    ReportsHealth,
    ReportsProviders,
)
from agent.backends.health import HealthChange, RestartPolicy
from agent.backends.onnx import ThreadPlan, thread_plan
from agent.backends.select import BackendKind, backend_kind, create_backend, worker_memory_bytes
from agent.ensemble.plan import is_ensemble
from agent.ensemble.runner import StepRunnerSlot
from agent.errors import (
    AgentError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
)
from agent.models.device_memory import DeviceMemoryProbe
from agent.models.ensemble_load import ServedConfig, ServedVersions, load_ensemble
from agent.models.memory_plan import Footprint, MemoryLedger
from agent.models.memory_probe import measure_version
from agent.models.served import (
    LoadedVersion,
    ModelBuild,
    ModelRecord,
    ModelState,
    ServedModel,
    VersionStatus,
)
from agent.models.version_memory import check_device_memory, fit_to_budget
from agent.models.version_scheduler import dynamic_scheduler, sequence_scheduler
from agent.models.version_warmup import warm_up
from agent.proto import model_config_pb2 as mc
from agent.repository import layout as repository
from agent.repository.autocomplete import DEFAULT_MAX_BATCH_SIZE, complete_config
from agent.repository.model_config import instance_count, load_model_config
from agent.repository.model_rules import check_against_model
from agent.repository.triton_rules import validate_completed
from agent.repository.validation import validate_config, validate_dims
from agent.scheduling.protocol import Scheduler
from agent.scheduling.scheduler import LimiterGate
from agent.scheduling.statistics import StatisticsRegistry
from agent.tensors.signature import ModelSignature

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How models are loaded."""

    auto_complete: bool = True
    # ONNX Runtime threads per run; 0: every core for a run that starts alone, the cores shared
    # between a model's instances for the others (agent.backends.onnx.ThreadPlan).
    intra_op_threads: int = 0
    max_queue_size: int = 1024  # per version, when the config's queue policy sets none
    measure_memory: bool = True  # measure each version's footprint and fit it to the budget
    engine_cache_root: Path | None = None  # where TensorRT engines built on the device are kept
    # A batch's tensors stay within an instance's planned bytes, but may always hold one request
    # of the largest size the API accepts (server.max_request_bytes).
    max_request_bytes: int = 64 * 1024 * 1024
    # How instances that fail while serving are restarted (agent.backends.health).
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    # An ONNX model asking for an accelerator this ONNX Runtime lacks runs on the CPU (flagged
    # everywhere) instead of being refused.
    allow_cpu_fallback: bool = False


# (model, version, build id, change): the registry's, told from the backend's threads.
HealthReport = Callable[[str, int, str, HealthChange], None]

# Where the served config says a version runs without the accelerators it asked for.
CPU_FALLBACK_PARAMETER = "cpu_fallback"


class ModelLoader:
    """Builds models from one repository (thread-safe: builds of different models may overlap)."""

    def __init__(
        self,
        root: Path,
        settings: LoadSettings,
        *,
        stats: StatisticsRegistry,
        ledger: MemoryLedger | None,
        gate: LimiterGate | None,
        served_config: ServedConfig,
        served_versions: ServedVersions | None = None,
        on_health: HealthReport | None = None,
    ) -> None:
        self.root = root
        self.settings = settings
        self.stats = stats
        self.ledger = ledger
        self._gate = gate
        self._served_config = served_config  # ensembles check their steps against these
        self._served_versions = served_versions
        self._on_health = on_health  # the registry: events, and a version that gave up
        self._lock = threading.Lock()
        self._generation = 0
        # Ensembles run their steps through the data plane, which binds its `infer` here.
        self.step_runner = StepRunnerSlot()
        # GPU memory (`agent.models.device_memory`): set by the daemon where a discrete GPU is.
        self.device_memory: DeviceMemoryProbe | None = None

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
            ModelNotFoundError: no such directory in the repository (or a name that would leave
                it, such as '..').
        """
        if model_dir is None and not repository.is_model_name(name):
            raise ModelNotFoundError(f"no model '{name}' in repository {self.root}")
        model_dir = model_dir or self.root / name
        if not model_dir.is_dir():
            raise ModelNotFoundError(f"no model directory '{name}' in the repository")
        record = ModelRecord()
        with self._lock:
            self._generation += 1
            generation = self._generation
        try:
            record.served = self._load(name, model_dir, record, config_override, generation)
        except AgentError as exc:
            record.reason = exc.message
            logger.error("model %s failed to load: %s", name, exc.message, extra={"model": name})
            return ModelBuild(name, None, record, exc)
        except Exception as exc:
            error = ModelLoadError(f"model '{name}': unexpected {type(exc).__name__}: {exc}")
            record.reason = error.message
            logger.exception("model %s failed to load", name, extra={"model": name})
            return ModelBuild(name, None, record, error)
        return ModelBuild(name, record.served, record, None)

    def _load(
        self,
        name: str,
        model_dir: Path,
        record: ModelRecord,
        config_override: mc.ModelConfig | None,
        generation: int,
    ) -> ServedModel:
        config = config_override if config_override is not None else load_model_config(model_dir)
        if config is None:
            if not self.settings.auto_complete:
                raise ModelConfigError(
                    f"model '{name}': config.pbtxt is missing and auto-complete is off"
                )
            config = mc.ModelConfig()
        validate_config(config, name)
        available = repository.list_versions(model_dir)
        wanted = repository.select_versions(config.version_policy, available)
        if is_ensemble(config):
            try:
                validate_dims(config, name)
                return load_ensemble(
                    name,
                    config,
                    wanted or [1],
                    record,
                    generation,
                    served_config=self._served_config,
                    served_versions=self._served_versions,
                    step_runner=self.step_runner,
                    stats=self.stats,
                )
            except AgentError as exc:  # as Triton: its versions are UNAVAILABLE, with why
                for version in wanted or [1]:
                    record.versions[version] = VersionStatus(
                        ModelState.UNAVAILABLE, _status_text(exc)
                    )
                raise
        if not wanted:
            raise ModelLoadError(f"model '{name}': no version folders (1/, 2/, ...) in its folder")
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
                reason = _status_text(exc)
                record.versions[version] = VersionStatus(ModelState.UNAVAILABLE, reason)
                logger.error(
                    "model %s version %d unavailable: %s",
                    name,
                    version,
                    reason,
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
        signature = ModelSignature.from_config(completed)
        return ServedModel(name, completed, signature, loaded, source=model_dir)

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
        validate_dims(config, name)
        instances = instance_count(config)
        path = model_dir / str(version) / repository.model_filename(config)
        kind = backend_kind(config, path.parent)
        threads = (
            thread_plan(config, instances, self.settings.intra_op_threads)
            if kind is BackendKind.ONNXRUNTIME
            else ThreadPlan(1, 1)
        )
        auto = self.settings.auto_complete and first
        # Old and new builds of one version coexist during a swap: each holds its own share.
        key = (name, f"{version}@{generation}")
        report = self._on_health
        listener = functools.partial(report, name, version, key[1]) if report is not None else None

        def load() -> tuple[Backend, mc.ModelConfig]:
            backend = create_backend(
                path.parent,
                config,
                threads.busy,
                cache_root=self.settings.engine_cache_root,
                model_name=name,
                version=version,
                auto_complete=auto,
                custom_metrics=self.stats.custom_metrics,
                bls=self.step_runner,  # Python models' BLS requests
                restart_policy=self.settings.restart_policy,
                health_listener=listener,
                allow_cpu_fallback=self.settings.allow_cpu_fallback,
                lone_intra_op_threads=threads.alone,
            )
            # A Python model's auto_complete_config may have declared more than the file said.
            declared = backend.declared_config if isinstance(backend, DeclaresConfig) else config
            try:
                check_against_model(config, name, backend.inputs, backend.outputs)
                checked = complete_config(
                    declared, name, backend.inputs, backend.outputs, auto_complete=auto
                )
                if first:
                    validate_completed(checked, name, gpus=_gpu_ids())
            except AgentError:
                backend.close()
                raise
            return backend, checked

        check_device_memory(self.device_memory, config, path.parent, name, version)
        footprint: Footprint | None = None
        estimated = ""  # why the footprint is an estimate from the model file, when it is
        warmed_up = False
        python = kind is BackendKind.PYTHON
        if self.settings.measure_memory and self.ledger is not None and not python:
            # Measured on the configured warm-up samples when there are some, else on zeros;
            # a model that fails on zeros loads with an estimate (agent.models.memory_probe).
            measured = measure_version(
                load,
                warm_up=functools.partial(self._warm_up_loaded, model_dir)
                if config.model_warmup
                else None,
                max_batch=config.max_batch_size or DEFAULT_MAX_BATCH_SIZE,
                limit_bytes=self.ledger.budget_bytes(),
                version_dir=path.parent,
                model_dir=model_dir,
            )
            backend, completed, footprint = measured.backend, measured.config, measured.footprint
            estimated, warmed_up = measured.estimated, measured.warmed_up
        else:
            backend, completed = load()
        fallback = cpu_fallback(backend)
        if fallback:  # the config response says so too
            completed.parameters[CPU_FALLBACK_PARAMETER].string_value = fallback
        try:
            if footprint is not None and self.ledger is not None:
                extra = backend.extra_runs if isinstance(backend, CountsExtraRuns) else 0
                completed = fit_to_budget(
                    self.ledger, completed, footprint, key, estimated, extra_runs=extra
                )
            elif python and self.settings.measure_memory and self.ledger is not None:
                # User code runs in worker processes, never on made-up zeros: the budget holds
                # what the workers are resident with after initialize.
                self.ledger.reserve(key, worker_memory_bytes(backend))
            if not warmed_up:
                warm_up(completed, model_dir, backend)
        except AgentError:
            backend.close()
            if self.ledger is not None:
                self.ledger.release(key)
            raise
        instances = instance_count(completed)
        executor = ThreadPoolExecutor(instances, thread_name_prefix=f"infer-{name}-{version}")
        stats = self.stats.get(name, str(version))
        scheduler: Scheduler
        if completed.HasField("sequence_batching"):
            scheduler = sequence_scheduler(
                completed,
                model_dir,
                backend,
                instances=instances,
                executor=executor,
                stats=stats,
                key=key,
                ledger=self.ledger,
                measure_memory=self.settings.measure_memory,
                python=python,
                max_queue_size=self.settings.max_queue_size,
            )
        else:
            scheduler = dynamic_scheduler(
                completed,
                backend,
                name=name,
                version=version,
                instances=instances,
                executor=executor,
                stats=stats,
                gate=self._gate,
                footprint=footprint,
                python=python,
                max_queue_size=self.settings.max_queue_size,
                max_request_bytes=self.settings.max_request_bytes,
            )
        logger.info(
            "model %s version %d ready (providers %s, max batch %d, %d instance(s)%s)",
            name,
            version,
            _providers(backend),
            completed.max_batch_size,
            instances,
            f", {footprint.bytes_for(max(1, completed.max_batch_size)) >> 20} MiB"
            if footprint
            else "",
            extra={"model": name, "version": version},
        )
        monitor = backend if isinstance(backend, ReportsHealth) else None
        return completed, LoadedVersion(
            version, backend, scheduler, executor, stats, footprint, key, monitor, fallback
        )

    def _warm_up_loaded(self, model_dir: Path, backend: Backend, config: mc.ModelConfig) -> None:
        warm_up(config, model_dir, backend)


@functools.cache
def _status_text(error: AgentError) -> str:
    """A version's reason as Triton's index gives it: its status code's name, then the text
    (a config rule: "Invalid argument"; anything that failed while loading: "Internal")."""
    code = "Invalid argument" if isinstance(error, ModelConfigError) else "Internal"
    return f"{code}: {error.message}"


def _gpu_ids() -> frozenset[int] | None:
    """Empty where the installed runtime has no GPU support (KIND_GPU is then refused, as by
    Triton's CPU-only builds); None (not checked) where it has."""
    return None if "CUDAExecutionProvider" in ort.get_available_providers() else frozenset()


def _providers(backend: Backend | None) -> tuple[str, ...]:
    return backend.providers if isinstance(backend, ReportsProviders) else ()


def cpu_fallback(backend: Backend | None) -> str:
    """What a version runs without (models.allow_cpu_fallback): the accelerators its config
    asked for that this runtime lacks, and what it runs on instead; "" when none is missing."""
    if not isinstance(backend, ReportsProviders) or not backend.missing_providers:
        return ""
    missing, used = ", ".join(backend.missing_providers), ", ".join(backend.providers)
    return (
        f"CPU fallback: requested execution providers not available: {missing}; running on "
        f"{used} (models.allow_cpu_fallback)"
    )


def _provider_note(loaded: LoadedVersion) -> str:
    """For the index: accelerators the config asked for that this runtime lacks."""
    return loaded.fallback
