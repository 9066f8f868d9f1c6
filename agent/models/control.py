"""Model control: load, unload and hot-swap models while the agent serves.

Two swap strategies, chosen per swap from the memory budget:

* load-then-switch (default): the new build loads and warms up in a worker thread while the old
  one serves; routing switches with one reference swap on the event loop; the old one drains its
  queued and running requests, then unloads. A failed build leaves the old one serving.
* drain-first (old and new do not both fit): new requests for the model wait at a gate (bounded:
  503 past `max_waiting`), the old one drains and unloads, the new one loads, the gate opens. If
  the new one fails, the old versions are loaded again.

Switching happens on the event loop, and a request goes from `resolve` to its scheduler's queue
without awaiting, so no request can reach a model after it stopped being routed to.

A failed load or swap is told once, after the old versions are back where the strategy puts
them: one `swap_failed` event with the reason and what serves now, and a log line that says the
same ("version 2 failed: ...; version 1 keeps serving", or "...; no version serves").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import (
    AgentError,
    InternalError,
    MemoryBudgetError,
    ModelNotFoundError,
    OverloadedError,
)
from agent.faults import fault
from agent.models.control_mode import ModelControlMode
from agent.models.events import EventSink, EventTee, guarded
from agent.models.registry import ModelRegistry
from agent.models.served import ModelBuild, ServedModel
from agent.proto import model_config_pb2 as mc

__all__ = ["ModelControlMode", "ModelManager"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Gate:
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0


class ModelManager:
    """Serializes load/unload per model and performs hot swaps.

    Events go through an `EventTee` (the one given, or one wrapping the given sink): a sink that
    fails is logged and reported, and the swap completes and releases the old version anyway.
    """

    def __init__(
        self, registry: ModelRegistry, events: EventSink | None = None, *, max_waiting: int = 256
    ) -> None:
        self._registry = registry
        self._events = guarded(events)
        self._max_waiting = max_waiting
        self._locks: dict[str, asyncio.Lock] = {}
        self._gates: dict[str, _Gate] = {}

    @property
    def events(self) -> EventTee:
        """Where this manager's model events go (never raises; see `agent.models.events`)."""
        return self._events

    def swapping(self, name: str) -> bool:
        """Whether `name` is being swapped drain-first: its requests wait (`wait_if_swapping`).
        A check without a coroutine, for the request path."""
        return name in self._gates

    async def wait_if_swapping(self, name: str) -> None:
        """Hold a request while its model is swapped drain-first (bounded).

        Raises:
            OverloadedError: too many requests are already waiting for this model.
        """
        gate = self._gates.get(name)
        if gate is None:
            return
        if gate.waiting >= self._max_waiting:
            raise OverloadedError(f"model '{name}' is being swapped; {gate.waiting} requests wait")
        gate.waiting += 1
        try:
            await gate.opened.wait()
        finally:
            gate.waiting -= 1

    async def load(
        self,
        name: str,
        config: mc.ModelConfig | None = None,
        *,
        source: Path | None = None,
        before_switch: Callable[[], None] | None = None,
        version: int | None = None,
        detail: Mapping[str, object] | None = None,
    ) -> str:
        """Load a model, or swap it for what the repository (or `config`) now says.

        Args:
            name: the model.
            config: a config to use instead of the model's config.pbtxt.
            source: load from this model folder instead of the repository's.
            before_switch: runs (in a worker thread) once the new build is ready and before
                routing switches, e.g. to activate the version in the cache; if it raises, the
                old model keeps serving.
            version: the version being loaded, when one is (for events and logs).
            detail: more fields for the `version_activated` event (e.g. the version's signer).

        Returns:
            The strategy used: "load", "load-then-switch" or "drain-first".

        Raises:
            ModelNotFoundError: no such model directory.
            AgentError: the new build failed; the old one (if any) still serves.
        """
        lock = self._locks.setdefault(name, asyncio.Lock())
        plan = _Plan(config, source, before_switch, version, dict(detail or {}))
        async with lock:
            try:
                return await self._load(name, plan)
            except ModelNotFoundError:
                raise
            except AgentError as exc:
                self._failed(name, plan, exc)
                raise
            except Exception as exc:  # a step's bug: still one event, the old build serves
                self._failed(name, plan, InternalError.wrap(exc))
                raise

    def _failed(self, name: str, plan: _Plan, error: AgentError) -> None:
        """Tell one failed load: the reason, and what serves now."""
        serving = next((s for s in self._registry.served_models() if s.name == name), None)
        versions = sorted(serving.versions) if serving is not None else []
        what = f"version {plan.version}" if plan.version is not None else "the new build"
        if versions:
            now = ", ".join(map(str, versions))
            truth = (
                f"version {now} keeps serving" if len(versions) == 1 else f"versions {now} serve"
            )
        else:
            truth = "no version serves"
        logger.error(
            "model %s: %s failed: %s; %s",
            name,
            what,
            error.message,
            truth,
            extra={"model": name, "version": plan.version, "strategy": plan.strategy},
        )
        self._events.record(
            name,
            plan.version,
            "swap_failed",
            {"reason": error.message, "strategy": plan.strategy, "serving": versions},
        )

    async def unload(self, name: str) -> None:
        """Stop serving a model; queued and running requests finish first.

        Raises:
            ModelNotFoundError: the model is not known.
        """
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            old = self._registry.unload(name)
            if old is not None:
                await _drain(old)
                await asyncio.to_thread(self._registry.release, old)
            self._events.record(name, None, "model_unloaded", {})

    async def _load(self, name: str, plan: _Plan) -> str:
        held = self._registry.reserved_bytes(name)
        ledger = self._registry.ledger
        if held and ledger is not None and ledger.left() < held:
            return await self._drain_first(name, plan, held, ledger.left())
        build = await asyncio.to_thread(self._registry.build, name, plan.config, plan.source)
        if build.served is None and isinstance(build.error, MemoryBudgetError) and held:
            logger.info("model %s: new build does not fit beside the old one", name)
            return await self._drain_first(name, plan, held, ledger.left() if ledger else 0)
        plan.strategy = "load-then-switch" if held else "load"
        await self._switch(build, plan)
        return plan.strategy

    async def _switch(self, build: ModelBuild, plan: _Plan) -> None:
        strategy = plan.strategy
        if build.served is not None:
            fault("swap-built")
        if build.served is not None and plan.before_switch is not None:
            try:
                await asyncio.to_thread(plan.before_switch)
            except Exception:  # whatever failed, the new build must not leak
                await asyncio.to_thread(self._registry.release, build.served)
                raise
        old = self._registry.commit(build)
        if build.served is None:  # the old model (if any) keeps serving: commit returned None
            raise build.error or AgentError(build.reason)
        fault("swap-switched")
        versions = sorted(build.served.versions)
        logger.info(
            "model %s now serves versions %s (strategy %s)",
            build.name,
            versions,
            strategy,
            extra={"model": build.name, "version": max(versions), "strategy": strategy},
        )
        self._events.record(
            build.name,
            max(versions),
            "version_activated",
            {"versions": versions, "strategy": strategy, **plan.detail},
        )
        if old is not None:
            await _drain(old)
            await asyncio.to_thread(self._registry.release, old)
            fault("swap-old-released")

    async def _drain_first(self, name: str, plan: _Plan, held: int, left: int) -> str:
        logger.warning(
            "model %s: swap strategy drain-first (old holds %d MiB, %d MiB left of the budget)",
            name,
            held >> 20,
            left >> 20,
        )
        plan.strategy = "drain-first"
        gate = self._gates[name] = _Gate()
        try:
            old = self._registry.unload(name)
            restore: mc.ModelConfig | None = None
            restore_from: Path | None = None
            if old is not None:
                restore, restore_from = _pinned(old), old.source
                await _drain(old)
                await asyncio.to_thread(self._registry.release, old)
            fault("swap-old-released")
            build = await asyncio.to_thread(self._registry.build, name, plan.config, plan.source)
            try:
                await self._switch(build, plan)
            except Exception:
                if restore is not None:
                    again = await asyncio.to_thread(
                        self._registry.build, name, restore, restore_from
                    )
                    self._registry.commit(again)
                raise
        finally:
            del self._gates[name]
            gate.opened.set()
        return "drain-first"


@dataclass(slots=True)
class _Plan:
    config: mc.ModelConfig | None
    source: Path | None
    before_switch: Callable[[], None] | None
    version: int | None
    detail: dict[str, object] = field(default_factory=dict)
    strategy: str = "load"


def _pinned(served: ServedModel) -> mc.ModelConfig:
    """The served config pinned to the versions it serves, to load exactly those again."""
    config = mc.ModelConfig()
    config.CopyFrom(served.config)
    config.version_policy.specific.versions[:] = sorted(served.versions)
    return config


async def _drain(served: ServedModel) -> None:
    await asyncio.gather(*(v.scheduler.drain() for v in served.versions.values()))
