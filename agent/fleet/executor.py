"""Executing fleet commands against the running agent, and the error → response code table.

`CommandExecutor.execute(body)` does what one typed command (`agent.fleet.commands`) asks, through
the
same `DataPlane` calls as HTTP, and returns the `result` object of the response. Errors are
`AgentError`s; `error_code` maps them to the response's `error.code` through one table,
`ERROR_CODES` (read with `agent.errors.lookup`; it lives with the other wire documents in
`agent.fleet.documents`), the MQTT counterpart of the HTTP layer's status table. Any other
exception is a bug and answers `internal`.

`set-batching` changes the live `BatchingPolicy` of each targeted loaded version (all checked
before any is changed); a later reload of the model restores its config's values.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.errors import (
    InvalidInputError,
    ModelControlError,
    ModelNotFoundError,
)
from agent.fleet import commands as cmd
from agent.fleet.documents import ERROR_CODES, error_code
from agent.fleet.state import FleetState
from agent.models.registry import ModelRegistry
from agent.models.served import LoadedVersion
from agent.scheduling.batching import BatchingPolicy
from agent.serving.dataplane import DataPlane

__all__ = ["ERROR_CODES", "CommandExecutor", "SyncNow", "error_code", "policy_json"]

SyncNow = Callable[[], Awaitable[Mapping[str, Any]]]  # raises AgentError on failure


class CommandExecutor:
    """Runs typed commands (see module docstring).

    Args:
        dataplane: load/unload/activate/rollback, and its canary manager.
        registry: Served models, for `set-batching`.
        state: Where `set-desired` is persisted.
        status: Builds the status document.
        rebirth: Re-reads the device facts and re-publishes the status; returns it (None:
            `rebirth` only answers the status).
        sync: Runs one sync cycle now; None: `sync` fails with "sync is not configured".
        on_desired: Told the new `MODEL=POLICY` lines after `set-desired`.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        registry: ModelRegistry,
        state: FleetState,
        *,
        status: Callable[[], dict[str, Any]],
        rebirth: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        sync: SyncNow | None = None,
        on_desired: Callable[[tuple[str, ...]], None] | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._registry = registry
        self._state = state
        self._status = status
        self._rebirth = rebirth
        self._sync = sync
        self._on_desired = on_desired

    async def execute(self, body: cmd.CommandBody) -> dict[str, Any]:
        """Execute one command.

        Raises:
            AgentError: the command failed; the agent's state is as the data plane left it
                (a failed swap keeps the old version serving).

        Returns:
            The response's `result` object.
        """
        dp = self._dataplane
        match body:
            case cmd.Status():
                return self._status()
            case cmd.Ping():
                return {"pong": True}
            case cmd.Rebirth():
                return await self._rebirth() if self._rebirth else self._status()
            case cmd.Sync():
                if self._sync is None:
                    raise ModelControlError("sync is not configured on this agent")
                return dict(await self._sync())
            case cmd.SetDesired(models=models):
                await asyncio.to_thread(self._state.set_desired, models)
                if self._on_desired is not None:
                    self._on_desired(body.as_lines())
                return {"desired": dict(models), "cleared": await self._lift(models)}
            case cmd.Load(model=model, config=config):
                strategy = await dp.load_model(model, dict(config) if config else None)
                return {"model": model, "strategy": strategy}
            case cmd.Unload(model=model):
                await dp.unload_model(model)
                return {"model": model}
            case cmd.Activate(model=model, version=version):
                return {"model": model, "strategy": await dp.activate_version(model, version)}
            case cmd.Rollback(model=model, version=version):
                return {"model": model, "version": await dp.rollback(model, version)}
            case cmd.ClearRejected(model=model, version=version):
                cleared = await dp.clear_rejected(model, version, by="clear-rejected")
                return {"model": model, "cleared": cleared}
            case cmd.SetBatching():
                return {"model": body.model, "versions": self.set_batching(body)}
            case cmd.CanaryStart(model=model, policy=policy):
                return dp.canary.start(model, policy)
            case cmd.CanaryStop(model=model):
                return dp.canary.stop(model)
            case cmd.CanaryStatus(model=model):
                return dp.canary.status(model)
        raise AssertionError(body)  # pragma: no cover - the match is exhaustive

    async def _lift(self, models: tuple[tuple[str, str], ...]) -> dict[str, list[int]]:
        """`set-desired` lifts the rejections of the models it names ("*": every model)."""
        dp = self._dataplane
        if dp.versions is None:
            return {}
        names = {m for m, _policy in models}
        if "*" in names:
            names = {str(r["model"]) for r in dp.rejected_versions()}
        lifted = {m: await dp.clear_rejected(m, None, by="set-desired") for m in sorted(names)}
        return {m: versions for m, versions in lifted.items() if versions}

    def set_batching(self, body: cmd.SetBatching) -> list[dict[str, Any]]:
        """Apply new batching parameters to the targeted loaded versions; returns the policies.

        Raises:
            ModelNotFoundError, ModelNotReadyError: the model or version is not loaded.
            InvalidInputError: a value the model or `BatchingPolicy` does not allow.
        """
        served, _ = self._registry.resolve(body.model, None)
        limit = served.config.max_batch_size
        if body.max_batch_size is not None and body.max_batch_size > max(limit, 1):
            raise InvalidInputError(
                f"max_batch_size {body.max_batch_size} is over the model's {max(limit, 1)}"
            )
        targets = sorted(served.versions) if body.version is None else [body.version]
        changed: list[tuple[LoadedVersion, BatchingPolicy]] = []
        for version in targets:
            loaded = served.versions.get(version)
            if loaded is None:
                raise ModelNotFoundError(f"version {version} of '{body.model}' is not loaded")
            old = loaded.scheduler.policy
            cap = body.max_batch_size or old.max_batch_size
            preferred = body.preferred_batch_sizes
            if preferred is None:
                preferred = tuple(s for s in old.preferred_batch_sizes if s <= cap)
            delay = old.max_queue_delay_us
            if body.max_queue_delay_us is not None:
                delay = body.max_queue_delay_us
            try:
                policy = dataclasses.replace(
                    old,
                    max_batch_size=cap,
                    max_queue_delay_us=delay,
                    preferred_batch_sizes=preferred,
                    dynamic_batching=limit > 0,
                )
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from None
            changed.append((loaded, policy))
        for loaded, policy in changed:
            loaded.scheduler.set_policy(policy)
        return [policy_json(loaded.version, policy) for loaded, policy in changed]


def policy_json(version: int, policy: BatchingPolicy) -> dict[str, Any]:
    """The batching parameters of one version, as `set-batching` reports them."""
    return {
        "version": version,
        "max_batch_size": policy.max_batch_size,
        "max_queue_delay_us": policy.max_queue_delay_us,
        "preferred_batch_sizes": list(policy.preferred_batch_sizes),
        "dynamic_batching": policy.dynamic_batching,
    }
