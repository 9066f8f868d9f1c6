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

from agent import repository
from agent.autocomplete import complete_config
from agent.backends.base import Backend
from agent.backends.onnx import OnnxBackend, default_intra_op_threads
from agent.errors import (
    AgentError,
    ModelConfigError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from agent.model_config import load_model_config
from agent.proto import model_config_pb2 as mc
from agent.signature import ModelSignature
from agent.warmup import warmup_requests

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


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """A version's state and, when not READY, why."""

    state: ModelState
    reason: str = ""


@dataclass(slots=True)
class ServedModel:
    """A model with at least one READY version."""

    name: str
    config: mc.ModelConfig
    signature: ModelSignature
    backends: dict[int, Backend]
    executor: ThreadPoolExecutor  # one worker per instance: N executions in flight

    @property
    def latest_version(self) -> int:
        return max(self.backends)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        for backend in self.backends.values():
            backend.close()


@dataclass(slots=True)
class _ModelRecord:
    served: ServedModel | None = None
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    reason: str = ""  # why the whole model is unavailable


def instance_count(config: mc.ModelConfig) -> int:
    """Executions in flight for a model: the sum of its instance groups' counts (default 1)."""
    return max(1, sum(max(1, g.count) for g in config.instance_group))


class ModelRegistry:
    """Owns the loaded models of one repository."""

    def __init__(self, repository_path: Path, settings: LoadSettings) -> None:
        self._root = repository_path
        self._settings = settings
        self._records: dict[str, _ModelRecord] = {}
        self._lock = threading.Lock()

    @property
    def repository(self) -> Path:
        return self._root

    def load_all(self) -> dict[str, str]:
        """Load every model in the repository; returns {model: reason} for those that failed."""
        failures = {}
        for name in repository.list_models(self._root):
            try:
                self.load_model(name)
            except AgentError as exc:
                failures[name] = exc.message
        return failures

    def load_model(self, name: str) -> ServedModel:
        """Load (or reload) one model's served versions.

        Raises:
            ModelNotFoundError: no such directory in the repository.
            ModelConfigError, ModelLoadError: the config is bad or no version could be loaded;
                the reason is also kept for the repository index.
        """
        model_dir = self._root / name
        if not model_dir.is_dir():
            raise ModelNotFoundError(f"no model '{name}' in repository {self._root}")
        record = _ModelRecord()
        with self._lock:
            self._records.setdefault(name, record)
        try:
            served = self._load(name, model_dir, record)
        except AgentError as exc:
            record.reason = exc.message
            logger.error("model %s failed to load: %s", name, exc.message)
            with self._lock:
                old = self._records.get(name)
                if old is None or old.served is None:
                    self._records[name] = record
            raise
        record.served = served
        with self._lock:
            old = self._records.get(name)
            self._records[name] = record
        if old is not None and old is not record and old.served is not None:
            old.served.close()
        return served

    def _load(self, name: str, model_dir: Path, record: _ModelRecord) -> ServedModel:
        config = load_model_config(model_dir)
        if config is None:
            if not self._settings.auto_complete:
                raise ModelConfigError(
                    f"model '{name}': {model_dir}/config.pbtxt is missing and auto-complete is off"
                )
            config = mc.ModelConfig()
        wanted = repository.select_versions(
            config.version_policy, repository.list_versions(model_dir)
        )
        if not wanted:
            raise ModelLoadError(f"model '{name}': no version folders (1/, 2/, ...) in {model_dir}")
        instances = instance_count(config)
        threads = self._settings.intra_op_threads or default_intra_op_threads(instances)
        backends: dict[int, Backend] = {}
        completed: mc.ModelConfig | None = None
        for version in sorted(wanted, reverse=True):  # the newest version completes the config
            record.versions[version] = VersionStatus(ModelState.LOADING)
            try:
                path = model_dir / str(version) / repository.model_filename(config)
                backend = OnnxBackend(path, config, threads)
                checked = complete_config(
                    completed or config,
                    name,
                    backend.inputs,
                    backend.outputs,
                    auto_complete=self._settings.auto_complete and completed is None,
                )
                completed = completed or checked
                self._warm_up(completed, model_dir, backend)
            except AgentError as exc:
                record.versions[version] = VersionStatus(ModelState.UNAVAILABLE, exc.message)
                logger.error("model %s version %d unavailable: %s", name, version, exc.message)
                continue
            backends[version] = backend
            record.versions[version] = VersionStatus(ModelState.READY)
            logger.info(
                "model %s version %d ready (providers %s)", name, version, backend.providers
            )
        if completed is None or not backends:
            reasons = "; ".join(
                f"version {v}: {s.reason}" for v, s in sorted(record.versions.items())
            )
            raise ModelLoadError(f"model '{name}': no version could be loaded ({reasons})")
        return ServedModel(
            name=name,
            config=completed,
            signature=ModelSignature.from_config(completed),
            backends=backends,
            executor=ThreadPoolExecutor(instances, thread_name_prefix=f"infer-{name}"),
        )

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
        if served is not None and number in served.backends:
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
                record.served.close()
