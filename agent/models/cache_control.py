"""Serving from the local model cache: activate and roll back cached versions with a hot swap.

Order of a swap, so that a crash at any point leaves a complete version served:
  1. load and warm up the target version from its own cached folder (the old one serves);
  2. activate it in the cache (the served repository view changes by one atomic rename, and
     the state database commits: the point of no return on disk);
  3. switch routing, drain and unload the old one.
A crash before 2 restarts on the old version; after 2, on the new one. If loading fails, the
cache is not touched and the failure is recorded as an event with its reason. The garbage
collection after a swap never fails it: a failed collection is a `cache_gc_failed` event.

Rejected versions (`ModelCache.rejections`): a version that fails to load or warm up here is
rejected with the load error, and the version an operator rolls back from is rejected too, so
that the sync does not bring it back. The sync's own activations refuse a rejected version; an
operator's `activate` or `rollback` to a version lifts its rejection first (the operator asked
for it), and a failure rejects it again. A failure of the cache itself (I/O, a corrupt blob) is
not the version's fault and rejects nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent.errors import (
    AgentError,
    CacheCommitError,
    ConflictError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
)
from agent.faults import fault
from agent.models.control import ModelManager
from agent.models.events import CACHE_GC_FAILED, EventSink, guarded
from model_cache.errors import CacheError, InvalidVersionError, VersionNotFoundError
from model_cache.layout import validate_model_name, validate_version
from model_cache.records import InstalledVersion, RejectionCause, VersionState

if TYPE_CHECKING:
    # The cache itself (SQLite behind it) is imported by whoever opens one: only with cache.dir.
    from model_cache.versions import ModelCache

logger = logging.getLogger(__name__)

#: A version's model signature record (`sync.provenance.Provenance.to_json()`), or None.
ProvenanceOf = Callable[[str, int], Mapping[str, Any] | None]


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
    Events (a failed collection) go to `events`, by default the manager's. `provenance` gives
    a version's model signature record (who signed it, verified or not): it is shown in
    `versions()` and in the `version_activated` event.
    """

    def __init__(
        self,
        cache: ModelCache,
        manager: ModelManager,
        *,
        keep_last: int = 2,
        disk_budget_bytes: int | None = None,
        events: EventSink | None = None,
        provenance: ProvenanceOf | None = None,
    ) -> None:
        self.cache = cache
        self._provenance = provenance
        self._manager = manager
        self._events = guarded(events) if events is not None else manager.events
        self._keep_last = keep_last
        self._disk_budget = disk_budget_bytes

    async def activate(self, model: str, version: int, *, operator: bool = False) -> str:
        """Serve a cached version of a model (hot swap). Returns the swap strategy used.

        Args:
            model: The model.
            version: A version the cache holds.
            operator: An operator asked for it: lift its rejection first. Otherwise (the sync)
                a rejected version is refused.

        Raises:
            InvalidInputError: a name or number the cache cannot hold.
            ModelNotFoundError: the cache does not hold that version.
            ConflictError: the version is rejected on this device (not `operator`).
            ModelLoadError: it failed verification, loading or warm-up (and is now rejected);
                the old one still serves.
        """
        _check_request(model, version)
        if operator:
            await asyncio.to_thread(self.clear_rejected, model, version, by="activate")
        else:
            await asyncio.to_thread(self._refuse_rejected, model, version)
        target = await asyncio.to_thread(self._get, model, version)
        strategy = await self._swap(model, version, target, rollback=False)
        await asyncio.to_thread(self.collect)
        return strategy

    async def rollback(self, model: str, to_version: int | None = None) -> int:
        """Re-activate a retained version (by default the one served before). Returns it.

        The version served until now is rejected ("rolled back from"), so the sync keeps the
        rollback; the version rolled back to loses its rejection, if it had one.

        Raises:
            InvalidInputError: a name or number the cache cannot hold.
            ModelNotFoundError: nothing retained to roll back to, or no such version.
            ModelLoadError: the version failed verification or loading; the current one serves.
        """
        _check_request(model, to_version)
        version = (
            to_version if to_version is not None else await asyncio.to_thread(self._previous, model)
        )
        await asyncio.to_thread(self.clear_rejected, model, version, by="rollback")
        target = await asyncio.to_thread(self._get, model, version)
        await self._swap(model, version, target, rollback=True)
        await asyncio.to_thread(self.collect)
        return version

    def clear_rejected(self, model: str, version: int | None = None, *, by: str) -> list[int]:
        """Lift rejections of a model (one version, or all): the sync may activate them again.

        Returns:
            The versions no longer rejected.

        Raises:
            ModelLoadError: the cache's database failed.
            InvalidInputError: a name or number the cache cannot hold.
        """
        _check_request(model, version)
        try:
            return [r.version for r in self.cache.rejections.clear(model, version, by=by)]
        except CacheError as exc:
            raise ModelLoadError(f"cache: {exc}") from None

    def rejected(self, model: str | None = None) -> list[dict[str, Any]]:
        """Rejected versions with cause and reason (for the HTTP API, status and telemetry)."""
        try:
            return [r.to_json() for r in self.cache.rejections.entries(model)]
        except CacheError as exc:
            logger.error("cannot read the rejected versions: %s", exc)
            return []

    def collect(self) -> None:
        """Drop old versions and unreferenced blobs; what is served is never evicted.

        Never raises: a failure is logged and recorded as a `cache_gc_failed` event.
        """
        from model_cache.gc import collect  # noqa: PLC0415 - with the cache (see the imports)

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
        """The cached versions of a model with their states and rejections (HTTP API, CLI).

        A rejected version whose files were evicted is listed too, with state "evicted".

        Raises:
            InvalidInputError: a name the cache cannot hold (such as '..').
        """
        _check_request(model)
        rejected = {r["version"]: r for r in self.rejected(model)}
        rows: list[dict[str, Any]] = [
            {
                "model": v.model,
                "version": v.version,
                "state": v.state.value,
                "reason": v.reason or "",
                "digest": v.digest,
            }
            for v in self.cache.list_versions(model)
        ]
        held = {row["version"] for row in rows}
        rows += [
            {"model": model, "version": n, "state": "evicted", "reason": "", "digest": ""}
            for n in rejected
            if n not in held
        ]
        for row in rows:
            found = rejected.get(row["version"])
            row["rejected"] = found is not None
            row["rejected_cause"] = found["cause"] if found else ""
            row["rejected_reason"] = found["reason"] if found else ""
            signature = self.signature(model, int(row["version"]))
            row["signer"] = str(signature.get("signer", "")) if signature else ""
            row["signature"] = signature
        return sorted(rows, key=lambda row: int(row["version"]))

    def signature(self, model: str, version: int) -> dict[str, Any] | None:
        """A version's model signature record (signer, verified, ...), or None without one."""
        if self._provenance is None:
            return None
        found = self._provenance(model, version)
        return dict(found) if found is not None else None

    async def _swap(
        self, model: str, version: int, target: InstalledVersion, *, rollback: bool
    ) -> str:
        """Load `target` and make it active; a load or warm-up failure rejects the version."""
        signature = await asyncio.to_thread(self.signature, model, version)
        detail = {"signer": signature.get("signer", "")} if signature else {}
        if signature:
            detail["signature_verified"] = bool(signature.get("verified"))
        try:
            return await self._manager.load(
                model,
                source=target.path,
                before_switch=lambda: self._commit(model, version, rollback=rollback),
                version=version,
                detail=detail,
            )
        except (ModelNotFoundError, CacheCommitError):
            raise
        except AgentError as exc:
            await asyncio.to_thread(self._reject, model, version, exc.message)
            raise

    def _reject(self, model: str, version: int, reason: str) -> None:
        try:
            self.cache.rejections.reject(model, version, RejectionCause.FAILED, reason)
        except CacheError as exc:
            logger.error("cannot reject %s version %d: %s", model, version, exc)

    def _refuse_rejected(self, model: str, version: int) -> None:
        try:
            found = self.cache.rejections.entries(model)
        except CacheError as exc:
            raise ModelLoadError(f"cache: {exc}") from None
        for item in found:
            if item.version == version:
                raise ConflictError(
                    f"version {version} of '{model}' is rejected on this device "
                    f"({item.cause.value}: {item.reason}); an operator must clear it"
                )

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
        """Activate in the cache (a worker thread, under the model's swap lock).

        A rollback first rejects the version served until now, then rolls back: a crash in
        between leaves that version rejected, and the sync then serves what the operator asked
        for. If the rollback fails, a rejection made here is lifted again.
        """
        made: int | None = None
        try:
            if rollback:
                current = self.cache.active_version(model)
                if current is not None and current.version != version:
                    reason = f"an operator rolled back to version {version}"
                    cause = RejectionCause.ROLLED_BACK
                    if self.cache.rejections.reject(model, current.version, cause, reason) is None:
                        made = current.version
                self.cache.rollback(model, version, fault=fault)
            else:
                self.cache.activate(model, version, fault=fault)
        except CacheError as exc:
            if made is not None:
                self._undo_reject(model, made)
            raise CacheCommitError(f"cache could not activate version {version}: {exc}") from None

    def _undo_reject(self, model: str, version: int) -> None:
        try:
            self.cache.rejections.clear(model, version, by="failed rollback")
        except CacheError as exc:
            logger.error("cannot lift the rejection of %s version %d: %s", model, version, exc)


def _check_request(model: str, version: int | None = None) -> None:
    """Refuse a name or number no cached version can have before the cache sees it (its
    InvalidVersionError would otherwise read as a failed load, or a bug).

    Raises:
        InvalidInputError: e.g. model '..', version 0 or 10**18.
    """
    try:
        validate_model_name(model)
        if version is not None:
            validate_version(version)
    except InvalidVersionError as exc:
        raise InvalidInputError(str(exc)) from None
