"""Serving from the local model cache: activate and roll back cached versions with a hot swap.

Order of a swap, so that a crash at any point leaves a complete version served:
  1. load and warm up the target version from its own cached folder (the old one serves);
  2. activate it in the cache (the served repository view changes by one atomic rename, and
     the state database commits: the point of no return on disk);
  3. switch routing, drain and unload the old one.
A crash before 2 restarts on the old version; after 2, on the new one. If loading fails, the
cache is not touched and the failure is recorded as an event with its reason. The garbage
collection after a swap never fails it: a failed collection is a `cache_gc_failed` event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from agent.errors import ModelLoadError, ModelNotFoundError
from agent.faults import fault
from agent.models.control import ModelManager
from agent.models.events import CACHE_GC_FAILED, EventSink, guarded
from model_cache import (
    CacheError,
    InstalledVersion,
    ModelCache,
    VersionNotFoundError,
    VersionState,
    collect,
)

logger = logging.getLogger(__name__)


class CacheEvents:
    """Model events go into the cache's state database (and the log)."""

    def __init__(self, cache: ModelCache) -> None:
        self._cache = cache

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        logger.info("event %s model=%s version=%s %s", kind, model, version, dict(detail))
        try:
            self._cache.record_event(model, version, kind, dict(detail))
        except CacheError as exc:
            logger.error("cannot record event %s for %s: %s", kind, model, exc)


class CachedVersions:
    """Activation and rollback of cached versions on a running agent.

    After each swap, old versions are collected: the active one plus `keep_last` retained per
    model stay, and least recently used ones go first while the cache is over its disk budget.
    Events (a failed collection) go to `events`, by default the manager's.
    """

    def __init__(
        self,
        cache: ModelCache,
        manager: ModelManager,
        *,
        keep_last: int = 2,
        disk_budget_bytes: int | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.cache = cache
        self._manager = manager
        self._events = guarded(events) if events is not None else manager.events
        self._keep_last = keep_last
        self._disk_budget = disk_budget_bytes

    async def activate(self, model: str, version: int) -> str:
        """Serve a cached version of a model (hot swap). Returns the swap strategy used.

        Raises:
            ModelNotFoundError: the cache does not hold that version.
            ModelLoadError: it failed verification, loading or warm-up; the old one still serves.
        """
        target = await asyncio.to_thread(self._get, model, version)
        strategy = await self._manager.load(
            model,
            source=target.path,
            before_switch=lambda: self._commit(model, version, rollback=False),
        )
        await asyncio.to_thread(self.collect)
        return strategy

    async def rollback(self, model: str, to_version: int | None = None) -> int:
        """Re-activate a retained version (by default the one served before). Returns it.

        Raises:
            ModelNotFoundError: nothing retained to roll back to, or no such version.
            ModelLoadError: the version failed verification or loading; the current one serves.
        """
        version = (
            to_version if to_version is not None else await asyncio.to_thread(self._previous, model)
        )
        target = await asyncio.to_thread(self._get, model, version)
        await self._manager.load(
            model,
            source=target.path,
            before_switch=lambda: self._commit(model, version, rollback=True),
        )
        await asyncio.to_thread(self.collect)
        return version

    def collect(self) -> None:
        """Drop old versions and unreferenced blobs; what is served is never evicted.

        Never raises: a failure is logged and recorded as a `cache_gc_failed` event.
        """
        try:
            served = {(m, v.version) for m, v in self.cache.served().items()}
            report = collect(
                self.cache, self._keep_last, self._disk_budget, protected=frozenset(served)
            )
        except Exception as exc:  # the swap before it is done: a failed GC must not undo it
            if isinstance(exc, CacheError):
                logger.error("cache garbage collection failed: %s", exc)
            else:
                logger.exception("cache garbage collection failed")
            reason = str(exc) if isinstance(exc, CacheError) else f"{type(exc).__name__}: {exc}"
            self._events.record("*", None, CACHE_GC_FAILED, {"reason": reason})
            return
        logger.info("cache garbage collection: %s", report)

    def versions(self, model: str) -> list[dict[str, Any]]:
        """The cached versions of a model with their states (for the HTTP API and the CLI)."""
        return [
            {
                "model": v.model,
                "version": v.version,
                "state": v.state.value,
                "reason": v.reason or "",
                "digest": v.digest,
            }
            for v in self.cache.list_versions(model)
        ]

    def _get(self, model: str, version: int) -> InstalledVersion:
        try:
            found = self.cache.get(model, version)
        except VersionNotFoundError:
            raise ModelNotFoundError(f"the cache holds no version {version} of '{model}'") from None
        except CacheError as exc:
            raise ModelLoadError(f"cache: {exc}") from None
        if found.state is VersionState.FAILED:
            raise ModelLoadError(
                f"version {version} of '{model}' failed verification: {found.reason}"
            )
        return found

    def _previous(self, model: str) -> int:
        retired = [v for v in self.cache.list_versions(model) if v.state is VersionState.RETIRED]
        if not retired:
            raise ModelNotFoundError(f"no retained version of '{model}' to roll back to")
        return max(retired, key=lambda v: v.last_used).version

    def _commit(self, model: str, version: int, *, rollback: bool) -> None:
        try:
            if rollback:
                self.cache.rollback(model, version, fault=fault)
            else:
                self.cache.activate(model, version, fault=fault)
        except CacheError as exc:
            raise ModelLoadError(f"cache could not activate version {version}: {exc}") from None
