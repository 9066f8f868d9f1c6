"""SIGHUP: re-read the config and apply, without a restart, what can change live.

Live: `log.level`; the restricted API groups (`server.http_restricted_api`,
`server.grpc_restricted_protocol`: the next request is judged by the new ones, once the agent
started with some on that protocol); the server TLS
certificate, key and client CA (re-read from the same files, served to new connections); and
each loaded model's `dynamic_batching` block (re-read from its `config.pbtxt`; every loaded
version's scheduler gets the new policy, with queued requests moved over in order). Everything
else in the agent's config needs a restart: it is logged by key, and the running agent keeps its
old value.

Invariants:

* A config file that does not load (bad TOML, unknown key, invalid value) changes nothing: the
  error is logged and the running config stands.
* Batching changes are per model and all-or-nothing: a model whose new block is invalid keeps
  its current policy on every version, and the others still change.
* A model's batch cap never rises on reload: preferred sizes above the cap the model was loaded
  with (possibly lowered to fit the memory budget) are dropped, as at load.
* Files are read off the event loop; policies are swapped on it (the schedulers' thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from agent.api.access import ApiAccess
from agent.api.tls import ServerTls
from agent.config.schema import AgentConfig
from agent.config.security import grpc_restrictions, http_restrictions
from agent.errors import AgentConfigError, AgentError
from agent.models.registry import ModelRegistry
from agent.models.served import ServedModel
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import load_model_config
from agent.runtime.systemd_notify import Notifier
from agent.scheduling.batching import BatchingPolicy
from agent.serving.log_settings import LogSettings

__all__ = ["ReloadReport", "Reloader", "restart_keys"]

logger = logging.getLogger(__name__)

_RESTRICTION_KEYS = ("http_restricted_api", "grpc_restricted_protocol")
_LIVE_KEYS = frozenset({"log.level", *(f"server.{key}" for key in _RESTRICTION_KEYS)})


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What one reload did."""

    applied: tuple[str, ...] = ()  # human-readable changes made live
    needs_restart: tuple[str, ...] = ()  # `section.key`s that changed but need a restart
    errors: tuple[str, ...] = ()  # what could not be applied, and why


def restart_keys(running: AgentConfig, new: AgentConfig) -> list[str]:
    """The `section.key`s whose values differ, except those applied live.

    Returns:
        Sorted dotted keys.
    """
    changed: list[str] = []
    for section in dataclasses.fields(running):
        old_part, new_part = getattr(running, section.name), getattr(new, section.name)
        if not dataclasses.is_dataclass(old_part):  # e.g. the [canary.MODEL] tables
            if old_part != new_part:
                changed.append(section.name)
            continue
        for field in dataclasses.fields(old_part):
            key = f"{section.name}.{field.name}"
            if key in _LIVE_KEYS:
                continue
            if getattr(old_part, field.name) != getattr(new_part, field.name):
                changed.append(key)
    return sorted(changed)


@dataclass(frozen=True, slots=True)
class _ModelUpdate:
    served: ServedModel
    config: mc.ModelConfig
    policy: BatchingPolicy


class Reloader:
    """Re-reads the config on SIGHUP and applies the live parts to a running agent."""

    def __init__(
        self,
        running: AgentConfig,
        load: Callable[[], AgentConfig],
        registry: ModelRegistry,
        notifier: Notifier | None = None,
        log_settings: LogSettings | None = None,
        *,
        tls: ServerTls | None = None,
        access: ApiAccess | None = None,
    ) -> None:
        """Args:
        running: the config the agent started with.
        load: reads the config again with the same file, environment and flags (raises
            AgentConfigError); called in a worker thread.
        registry: the loaded models.
        notifier: told RELOADING=1 and then READY=1 around each reload.
        log_settings: the live log settings (`/v2/logging`), reset to the new `log.level`.
        tls: the listeners' TLS, whose files are read again (a certificate rotation).
        access: the restricted API groups in force, replaced by the new config's.
        """
        self._tls = tls
        self._access = access
        self._running = running
        self._load = load
        self._registry = registry
        self._notifier = notifier
        self._log_settings = log_settings
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[ReloadReport]] = set()

    @property
    def config(self) -> AgentConfig:
        """The running config: the start-up one with the live changes made since."""
        return self._running

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reload on SIGHUP (systemd's `ExecReload=/bin/kill -HUP $MAINPID`)."""
        loop.add_signal_handler(signal.SIGHUP, self._on_signal)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop reacting to SIGHUP (call at shutdown)."""
        loop.remove_signal_handler(signal.SIGHUP)

    def _on_signal(self) -> None:
        logger.info("SIGHUP: reloading the config")
        task = asyncio.get_running_loop().create_task(self.reload(), name="config-reload")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> ReloadReport:
        """Re-read the config and the models' batching blocks; apply what can change live.

        Reloads run one at a time; a SIGHUP during a reload waits its turn.

        Returns:
            What was applied, what needs a restart, and what failed.
        """
        async with self._lock:
            if self._notifier is not None:
                self._notifier.reloading()
            try:
                report = await self._reload()
            finally:
                if self._notifier is not None:
                    self._notifier.ready("reloaded the config")
            return report

    async def _reload(self) -> ReloadReport:
        applied: list[str] = []
        errors: list[str] = []
        if self._tls is not None:  # first: a rotation does not wait on a config that fails
            try:
                await asyncio.to_thread(self._tls.reload)
            except AgentError as exc:
                logger.error("config reload: keeping the running TLS certificate: %s", exc.message)
                errors.append(exc.message)
            else:
                applied.append(f"server TLS: {self._tls.files.cert} reloaded")
        try:
            new = await asyncio.to_thread(self._load)
        except AgentConfigError as exc:
            logger.error("config reload failed, keeping the running config: %s", exc)
            return ReloadReport(tuple(applied), errors=(*errors, str(exc)))
        restart = restart_keys(self._running, new)
        for key in restart:
            logger.warning("config reload: %s changed; it takes effect after a restart", key)
        if new.log.level is not self._running.log.level:
            if self._log_settings is not None:
                self._log_settings.set_level(new.log.level)
            else:
                logging.getLogger().setLevel(new.log.level.upper())
            applied.append(f"log.level: {self._running.log.level} -> {new.log.level}")
            logger.warning("config reload: log level now %s", new.log.level)
            self._running = dataclasses.replace(self._running, log=new.log)
        applied.extend(self._apply_restrictions(new, restart))
        served = self._registry.served_models()
        updates = await asyncio.to_thread(_read_batching, self._registry, served, errors)
        for update in updates:
            applied.extend(_apply(update))
        logger.info(
            "config reload done: %d change(s) applied, %d need a restart, %d error(s)",
            len(applied),
            len(restart),
            len(errors),
        )
        return ReloadReport(tuple(applied), tuple(restart), tuple(errors))

    def _apply_restrictions(self, new: AgentConfig, restart: list[str]) -> list[str]:
        """Swap in the new restricted API groups (validated by the load); values never logged.

        A protocol that started without any restriction has no check installed (none costs
        nothing per request): restricting it for the first time is added to `restart`.
        """
        server = self._running.server
        applied: list[str] = []
        for key, parse, protocol in (
            ("http_restricted_api", http_restrictions, "http"),
            ("grpc_restricted_protocol", grpc_restrictions, "grpc"),
        ):
            if getattr(server, key) == getattr(new.server, key):
                continue
            restrictions = parse(new.server)
            if self._access is None or (restrictions and protocol not in self._access.enforced):
                logger.warning(
                    "config reload: server.%s changed; it takes effect after a restart", key
                )
                restart.append(f"server.{key}")
                continue
            setattr(self._access, protocol, restrictions)
            server = dataclasses.replace(server, **{key: getattr(new.server, key)})
            logger.warning("config reload: server.%s updated", key)
            applied.append(f"server.{key} updated")
        self._running = dataclasses.replace(self._running, server=server)
        return applied


def _read_batching(
    registry: ModelRegistry, served: list[ServedModel], errors: list[str]
) -> list[_ModelUpdate]:
    """Worker thread: each served model's new config (its batching block swapped) and policy."""
    updates: list[_ModelUpdate] = []
    for model in served:
        try:
            update = _model_update(registry, model)
        except AgentError as exc:
            logger.error(
                "config reload: model %s keeps its batching policy: %s", model.name, exc.message
            )
            errors.append(f"{model.name}: {exc.message}")
            continue
        if update is not None:
            updates.append(update)
    return updates


def _model_update(registry: ModelRegistry, model: ServedModel) -> _ModelUpdate | None:
    """The served config with the file's `dynamic_batching`; None when that block is unchanged.

    Raises:
        ModelConfigError: the file does not parse, or its block is invalid for this model.
    """
    from_file = load_model_config(registry.repository / model.name)
    if from_file is None:  # auto-completed model without config.pbtxt: nothing to re-read
        return None
    current = model.config
    if from_file.HasField("dynamic_batching") == current.HasField("dynamic_batching") and (
        not from_file.HasField("dynamic_batching")
        or _same_block(from_file.dynamic_batching, current.dynamic_batching, current)
    ):
        return None
    merged = mc.ModelConfig()
    merged.CopyFrom(current)
    if from_file.HasField("dynamic_batching"):
        merged.dynamic_batching.CopyFrom(from_file.dynamic_batching)
        cap = max(current.max_batch_size, 1)
        kept = [s for s in merged.dynamic_batching.preferred_batch_size if s <= cap]
        if len(kept) != len(merged.dynamic_batching.preferred_batch_size):
            logger.warning(
                "config reload: model %s: preferred batch sizes above its cap %d are dropped",
                model.name,
                cap,
            )
            del merged.dynamic_batching.preferred_batch_size[:]
            merged.dynamic_batching.preferred_batch_size.extend(kept)
    else:
        merged.ClearField("dynamic_batching")
    policy = BatchingPolicy.from_config(merged)
    return _ModelUpdate(model, merged, policy)


def _same_block(
    from_file: mc.ModelDynamicBatching,
    current: mc.ModelDynamicBatching,
    current_config: mc.ModelConfig,
) -> bool:
    """Equal once preferred sizes above the served cap are dropped from the file's block."""
    cap = max(current_config.max_batch_size, 1)
    candidate = mc.ModelDynamicBatching()
    candidate.CopyFrom(from_file)
    kept = [s for s in candidate.preferred_batch_size if s <= cap]
    del candidate.preferred_batch_size[:]
    candidate.preferred_batch_size.extend(kept)
    return bool(candidate == current)


def _apply(update: _ModelUpdate) -> list[str]:
    """On the loop: give every loaded version the new policy, then publish the new config."""
    model = update.served
    for loaded in model.versions.values():
        loaded.scheduler.set_policy(update.policy)
    # One reference swap: readers see the old config or the new one, never a mix.
    model.config = update.config
    policy = update.policy
    logger.warning(
        "config reload: model %s dynamic batching now max_queue_delay_us=%d preferred=%s "
        "max_batch_size=%d (versions %s)",
        model.name,
        update.config.dynamic_batching.max_queue_delay_microseconds,
        list(update.config.dynamic_batching.preferred_batch_size),
        policy.max_batch_size,
        ",".join(str(v) for v in sorted(model.versions)),
    )
    return [f"model {model.name}: dynamic_batching updated"]
