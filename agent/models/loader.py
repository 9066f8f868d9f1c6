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
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from agent.backends.base import Backend
from agent.backends.onnx import default_intra_op_threads
from agent.backends.select import BackendKind, backend_kind, create_backend, worker_memory_bytes
from agent.ensemble.plan import build_plan, composing_model_names, is_ensemble
from agent.ensemble.runner import EnsembleScheduler, StepRunnerSlot
from agent.errors import (
    AgentError,
    MemoryBudgetError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
)
from agent.models.device_memory import (
    DeviceMemoryProbe,
    MemoryKind,
    check_device_fit,
    device_need_bytes,
    folder_bytes,
    gpu_device,
)
from agent.models.memory_plan import Footprint, MemoryLedger, fit_config, plan_capacity
from agent.models.memory_probe import measure_version
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
from agent.repository.autocomplete import DEFAULT_MAX_BATCH_SIZE, complete_config
from agent.repository.model_config import instance_count, load_model_config
from agent.repository.model_rules import check_against_model
from agent.repository.triton_rules import validate_completed
from agent.repository.validation import validate_config
from agent.repository.warmup import warmup_requests
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.rate_limiter import ResourceNeed
from agent.scheduling.scheduler import INLINE_BELOW_NS, LimiterGate, ModelScheduler
from agent.scheduling.sequence_policy import SequencePolicy
from agent.scheduling.sequence_scheduler import SequenceScheduler
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.scheduling.statistics import ModelStatistics, StatisticsRegistry
from agent.tensors.limits import output_row_bytes
from agent.tensors.signature import ModelSignature

logger = logging.getLogger(__name__)

ServedConfig = Callable[[str], "mc.ModelConfig | None"]
ServedVersions = Callable[[str], "Collection[int] | None"]


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """How models are loaded."""

    auto_complete: bool = True
    intra_op_threads: int = 0  # 0: the cores shared between a model's instances
    max_queue_size: int = 1024  # per version, when the config's queue policy sets none
    measure_memory: bool = True  # measure each version's footprint and fit it to the budget
    engine_cache_root: Path | None = None  # where TensorRT engines built on the device are kept
    # A batch's tensors stay within an instance's planned bytes, but may always hold one request
    # of the largest size the API accepts (server.max_request_bytes).
    max_request_bytes: int = 64 * 1024 * 1024


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
    ) -> None:
        self.root = root
        self.settings = settings
        self.stats = stats
        self.ledger = ledger
        self._gate = gate
        self._served_config = served_config  # ensembles check their steps against these
        self._served_versions = served_versions
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
            return self._load_ensemble(name, config, wanted or [1], record, generation)
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
        signature = ModelSignature.from_config(completed)
        return ServedModel(name, completed, signature, loaded, source=model_dir)

    def _load_ensemble(
        self,
        name: str,
        config: mc.ModelConfig,
        versions: list[int],
        record: ModelRecord,
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
        plan = build_plan(completed, self._served_config, self._served_versions)
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
        threads = self.settings.intra_op_threads or default_intra_op_threads(instances)
        path = model_dir / str(version) / repository.model_filename(config)
        auto = self.settings.auto_complete and first

        def load() -> tuple[Backend, mc.ModelConfig]:
            backend = create_backend(
                path.parent,
                config,
                threads,
                cache_root=self.settings.engine_cache_root,
                model_name=name,
                version=version,
                auto_complete=auto,
                custom_metrics=self.stats.custom_metrics,
                bls=self.step_runner.submit_threadsafe,  # Python models' BLS requests
            )
            # A Python model's auto_complete_config may have declared more than the file said.
            declared = getattr(backend, "declared_config", config)
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

        self._check_device_memory(config, path.parent, name, version)
        footprint: Footprint | None = None
        estimated = ""  # why the footprint is an estimate from the model file, when it is
        warmed_up = False
        python = backend_kind(config, path.parent) is BackendKind.PYTHON
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
        # Old and new builds of one version coexist during a swap: each holds its own share.
        key = (name, f"{version}@{generation}")
        try:
            if footprint is not None and self.ledger is not None:
                completed = self._fit_to_budget(completed, footprint, key, estimated)
            elif python and self.settings.measure_memory and self.ledger is not None:
                # User code runs in worker processes, never on made-up zeros: the budget holds
                # what the workers are resident with after initialize.
                self.ledger.reserve(key, worker_memory_bytes(backend))
            if not warmed_up:
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
        sequence = (
            self._sequence_scheduler(
                completed, model_dir, backend, instances, executor, stats, key, python=python
            )
            if completed.HasField("sequence_batching")
            else None
        )
        scheduler = sequence or ModelScheduler(
            model=name,
            version=version,
            backend=backend,
            policy=policy,
            instances=instances,
            executor=executor,
            stats=stats,
            gate=self._gate,
            need=_resource_need(completed, self._gate),
            max_pending=_queue_bound(policy, self.settings.max_queue_size),
            # A Python model's run is a wait on its worker process, cheap in CPU but unbounded
            # when user code hangs: it must never run on the event loop.
            inline_below_ns=0 if python else INLINE_BELOW_NS,
            max_batch_bytes=None
            if footprint is None
            else max(
                footprint.bytes_for(max(1, completed.max_batch_size)),
                self.settings.max_request_bytes,
            ),
            output_row_bytes=output_row_bytes(ModelSignature.from_config(completed)),
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

    def _sequence_scheduler(
        self,
        config: mc.ModelConfig,
        model_dir: Path,
        backend: Backend,
        instances: int,
        executor: ThreadPoolExecutor,
        stats: ModelStatistics,
        key: tuple[str, str],
        *,
        python: bool,
    ) -> SequenceScheduler:
        """The sequence batcher of a stateful model; its slots' state counts in the budget.

        Raises:
            ModelConfigError: a control or state the config describes cannot be built.
            MemoryBudgetError: the state of every slot does not fit beside the model.
        """
        try:
            policy = SequencePolicy.from_config(config, instances, self.settings.max_queue_size)
            tensors = SequenceTensors.from_config(config, model_dir)
            if self.ledger is not None and self.settings.measure_memory and tensors.states:
                held = self.ledger.reserved().get(key, 0)
                self.ledger.reserve(key, held + tensors.state_bytes * policy.slots)
        except AgentError:
            executor.shutdown(wait=False)
            backend.close()
            if self.ledger is not None:
                self.ledger.release(key)
            raise
        return SequenceScheduler(
            model=config.name,
            version=int(key[1].split("@")[0]),
            backend=backend,
            policy=policy,
            tensors=tensors,
            instances=instances,
            executor=executor,
            stats=stats,
            inline_below_ns=0 if python else INLINE_BELOW_NS,  # as for the dynamic scheduler
        )

    def _check_device_memory(
        self, config: mc.ModelConfig, version_dir: Path, name: str, version: int
    ) -> None:
        """Refuse, before loading, a GPU version that does not fit in its GPU's free memory."""
        probe = self.device_memory
        if probe is None or probe.kind is MemoryKind.UNIFIED:
            return  # no GPU, or its memory is the host's (the host budget covers it)
        tensorrt = backend_kind(config, version_dir) is BackendKind.TENSORRT
        device = gpu_device(config, tensorrt=tensorrt)
        memory = probe.read(device) if device is not None else None
        if memory is None:
            return
        need = device_need_bytes(folder_bytes(version_dir))
        check_device_fit(need, memory, model=name, version=version)
        logger.info(
            "model %s version %d: %d MiB of GPU %d memory expected, %d MiB free",
            name,
            version,
            need >> 20,
            device,
            memory.free_bytes >> 20,
            extra={"model": name},
        )

    def _fit_to_budget(
        self,
        config: mc.ModelConfig,
        footprint: Footprint,
        key: tuple[str, str],
        estimated: str = "",
    ) -> mc.ModelConfig:
        """Reserve what the version needs of what is left, lowering its batch cap and instances.

        `estimated` says why the footprint is an estimate from the model file (not measured):
        the log, a refusal and the config's `edge_agent_memory_plan` parameter say so too.
        """
        assert self.ledger is not None
        try:
            plan = plan_capacity(
                footprint,
                budget_left=self.ledger.left(),
                max_batch_size=config.max_batch_size,
                instances=instance_count(config),
                budget_bytes=self.ledger.budget_bytes(),
            )
        except MemoryBudgetError as exc:
            if estimated:
                raise MemoryBudgetError(f"{exc.message} ({estimated})") from None
            raise
        self.ledger.reserve(key, plan.estimated_bytes)
        fitted = fit_config(config, plan)
        if fitted is not config:
            logger.warning("model %s version %s: %s", key[0], key[1], plan.reason)
        if estimated:
            logger.warning(
                "model %s version %s: %s: %d MiB at batch 1; %s",
                key[0],
                key[1],
                estimated,
                footprint.bytes_for(1) >> 20,
                plan.reason,
                extra={"model": key[0]},
            )
            if fitted is config:
                fitted = mc.ModelConfig()
                fitted.CopyFrom(config)
            fitted.parameters[
                "edge_agent_memory_plan"
            ].string_value = (
                f"{estimated}: {_mib(footprint.bytes_for(1))} at batch 1; {plan.reason}"
            )
        return fitted

    def _warm_up_loaded(self, model_dir: Path, backend: Backend, config: mc.ModelConfig) -> None:
        self._warm_up(config, model_dir, backend)

    def _warm_up(self, config: mc.ModelConfig, model_dir: Path, backend: Backend) -> None:
        signature = ModelSignature.from_config(config)
        for sample_name, request, count in warmup_requests(config, model_dir):
            try:
                valid = signature.validate(request)
            except AgentError as exc:
                raise ModelConfigError(f"model_warmup '{sample_name}': {exc.message}") from None
            feeds = dict(valid.feeds)
            if config.HasField("sequence_batching"):
                feeds.update(
                    SequenceTensors.from_config(config, model_dir).starting_feeds(valid.batch_size)
                )
            for _ in range(count):
                backend.run(feeds, valid.output_names)


@functools.cache
def _gpu_ids() -> frozenset[int] | None:
    """Empty where the installed runtime has no GPU support (KIND_GPU is then refused, as by
    Triton's CPU-only builds); None (not checked) where it has."""
    return None if "CUDAExecutionProvider" in ort.get_available_providers() else frozenset()


def load_order(root: Path, names: list[str]) -> list[str]:
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


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f}".removesuffix(".0") + " MiB"
