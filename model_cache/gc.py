"""Garbage collection: retention per model, then a disk budget, least recently used first.

Policy, in order:

    1. Failed versions are evicted (their folders hold bytes that can never be served).
    2. Per model, the active version is kept, plus the `keep_last` most recently used versions
       among the ready and retired ones (recency = `last_used`, then version number); older
       ready/retired versions are evicted.
    3. Blobs no remaining version references are deleted.
    4. While blob bytes exceed `disk_budget_bytes`, the least recently used ready/retired
       version across all models is evicted (even within `keep_last`) and step 3 repeats.
    5. View generations other than the current and the previous one are removed.

Never evicted: active versions, staged versions (an install is running), and every
(model, version) in `protected` (e.g. a version the agent is loading or warming up). When only
those remain and the budget is still exceeded, `GcReport.over_budget` says so; nothing raises.

Invariants:
    * The plan (`plan_retention`, `budget_order`) is pure: it takes records and returns which
      to evict, so the policy is tested without a disk.
    * Collection holds the cache's lock throughout, so no version is activated between being
      chosen and being evicted.
    * Each eviction commits in the database before its folder is removed (see
      `VersionInstaller.uninstall`); a crash mid-GC leaves only garbage recovery removes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from model_cache.records import InstalledVersion, VersionState
from model_cache.versions import ModelCache

logger = logging.getLogger(__name__)

#: States GC may evict; active and staged versions are never touched.
_EVICTABLE = frozenset({VersionState.READY, VersionState.RETIRED, VersionState.FAILED})
_RETAINED = frozenset({VersionState.READY, VersionState.RETIRED})


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one collection did.

    Attributes:
        evicted: (model, version, why) in eviction order.
        removed_blobs: Blob files deleted.
        freed_bytes: Bytes those blobs held.
        bytes_before: Blob bytes before collecting.
        bytes_after: Blob bytes after collecting.
        budget_bytes: The budget collected against, if any.
        removed_views: Old view generations removed.
    """

    evicted: tuple[tuple[str, int, str], ...]
    removed_blobs: int
    freed_bytes: int
    bytes_before: int
    bytes_after: int
    budget_bytes: int | None
    removed_views: int

    @property
    def over_budget(self) -> bool:
        """True when protected and active versions alone exceed the budget."""
        return self.budget_bytes is not None and self.bytes_after > self.budget_bytes


def _recency(version: InstalledVersion) -> tuple[float, int]:
    return version.last_used, version.version


def plan_retention(
    versions: Sequence[InstalledVersion],
    keep_last: int,
    protected: Collection[tuple[str, int]] = frozenset(),
) -> list[tuple[InstalledVersion, str]]:
    """Steps 1 and 2 of the policy: which versions to evict regardless of the budget.

    Args:
        versions: Every version of every model.
        keep_last: Ready/retired versions kept per model besides the active one.
        protected: (model, version) pairs never to evict.

    Raises:
        ValueError: `keep_last` is negative.

    Returns:
        (version, why) pairs, failed ones first, then per model oldest first.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, not {keep_last}")
    candidates = [
        v for v in versions if v.state in _EVICTABLE and (v.model, v.version) not in protected
    ]
    plan = [
        (v, f"failed: {v.reason or 'unknown'}")
        for v in sorted(candidates, key=lambda v: (v.model, v.version))
        if v.state is VersionState.FAILED
    ]
    for model in sorted({v.model for v in candidates}):
        retained = [v for v in candidates if v.model == model and v.state in _RETAINED]
        newest_first = sorted(retained, key=_recency, reverse=True)
        old = sorted(newest_first[keep_last:], key=_recency)
        plan.extend((v, f"older than the last {keep_last} retained") for v in old)
    return plan


def budget_order(
    versions: Sequence[InstalledVersion],
    protected: Collection[tuple[str, int]] = frozenset(),
) -> list[InstalledVersion]:
    """Step 4's candidates: ready/retired, unprotected versions, least recently used first.

    Args:
        versions: Versions still present after steps 1-3.
        protected: (model, version) pairs never to evict.

    Returns:
        The versions in eviction order.
    """
    evictable = [
        v for v in versions if v.state in _RETAINED and (v.model, v.version) not in protected
    ]
    return sorted(evictable, key=lambda v: (*_recency(v), v.model))


def collect(
    cache: ModelCache,
    keep_last: int,
    disk_budget_bytes: int | None = None,
    protected: Collection[tuple[str, int]] = frozenset(),
) -> GcReport:
    """Evict old versions and unreferenced blobs (see the module docstring for the policy).

    Args:
        cache: The cache to collect.
        keep_last: Ready/retired versions kept per model besides the active one.
        disk_budget_bytes: Evict least recently used versions until blob bytes fit, if given.
        protected: (model, version) pairs never to evict (loading or in use).

    Raises:
        ValueError: `keep_last` is negative, or the budget is.
        CacheError: I/O or database error (what was evicted before it stays evicted).

    Returns:
        What was done.
    """
    if disk_budget_bytes is not None and disk_budget_bytes < 0:
        raise ValueError(f"disk_budget_bytes must be >= 0, not {disk_budget_bytes}")
    evicted: list[tuple[str, int, str]] = []
    with cache.exclusive():
        before = cache.disk_usage()
        for version, why in plan_retention(_all_versions(cache), keep_last, protected):
            cache.evict(version.model, version.version, reason=why)
            evicted.append((version.model, version.version, why))
        removed, freed = cache.remove_unreferenced_blobs()
        usage = cache.disk_usage()
        if disk_budget_bytes is not None and usage > disk_budget_bytes:
            for version in budget_order(_all_versions(cache), protected):
                if usage <= disk_budget_bytes:
                    break
                why = f"over the disk budget ({usage} > {disk_budget_bytes} bytes)"
                cache.evict(version.model, version.version, reason=why)
                evicted.append((version.model, version.version, why))
                more, more_bytes = cache.remove_unreferenced_blobs()
                removed, freed = removed + more, freed + more_bytes
                usage = cache.disk_usage()
        views = cache.prune_views()
    report = GcReport(
        evicted=tuple(evicted),
        removed_blobs=removed,
        freed_bytes=freed,
        bytes_before=before,
        bytes_after=usage,
        budget_bytes=disk_budget_bytes,
        removed_views=views,
    )
    if report.over_budget:
        logger.warning("Cache still over budget after GC: %d > %d bytes", usage, disk_budget_bytes)
    logger.info("GC evicted %d versions and %d blobs, freed %d bytes", len(evicted), removed, freed)
    return report


def _all_versions(cache: ModelCache) -> list[InstalledVersion]:
    return [v for model in cache.models() for v in cache.list_versions(model)]
