"""Rejected versions: what this device will not activate by itself, and why.

    cache.rejections.reject("resnet", 2, RejectionCause.FAILED, "warm-up failed: ...")
    cache.rejections.entries("resnet")          # [RejectedVersion(...)]
    cache.rejections.clear("resnet", by="set-desired")

A version is rejected when it failed to load or warm up on this device, or when an operator
rolled back from it. The sync reads the list and skips those versions (`sync/policy.py`); only an
operator clears them (`set-desired`, `activate`, `clear-rejected`).

Invariants:
    * A rejection is durable (one SQLite transaction, with its event) and outlives the eviction
      of the version's files: an evicted rejected version is not downloaded again to fail again.
    * Rejecting never changes what is served; it only records a fact for the sync to read.
"""

from __future__ import annotations

import logging
import threading

from model_cache.layout import validate_model_name, validate_version
from model_cache.records import RejectedVersion, RejectionCause
from model_cache.state import StateDB

logger = logging.getLogger(__name__)


class Rejections:
    """The rejected versions of one cache (use `ModelCache.rejections`).

    Args:
        state: The cache's state database.
        lock: The cache's lock (rejections are serialized with activations).
    """

    def __init__(self, state: StateDB, lock: threading.RLock) -> None:
        self._state = state
        self._lock = lock

    def reject(
        self, model: str, version: int, cause: RejectionCause, reason: str
    ) -> RejectedVersion | None:
        """Reject a version on this device (again, if it was: the newer reason wins).

        Args:
            model: Model name.
            version: Version number; it need not be in the cache.
            cause: Failed here, or rolled back from.
            reason: What to show operators (the load error, or which rollback).

        Raises:
            CacheError: Bad name or version, or a database error.

        Returns:
            The rejection this one replaced, or None.
        """
        validate_model_name(model)
        validate_version(version)
        with self._lock:
            row = self._state.get(model, version)
            previous = self._state.reject(
                model, version, cause, reason, row.digest if row else None
            )
        logger.warning(
            "%s version %d is rejected on this device (%s): %s", model, version, cause.value, reason
        )
        return previous

    def clear(
        self, model: str | None = None, version: int | None = None, *, by: str
    ) -> list[RejectedVersion]:
        """Lift rejections so the sync may activate those versions again.

        Args:
            model: One model, or None for every model.
            version: One version of `model`, or None for every version.
            by: Who or what cleared them ("activate", "set-desired", "clear-rejected", ...).

        Raises:
            CacheError: Bad name or version, or a database error.

        Returns:
            The rejections lifted (empty when there were none).
        """
        if model is not None:
            validate_model_name(model)
        if version is not None:
            validate_version(version)
        with self._lock:
            gone = self._state.clear_rejected(model, version, by=by)
        for item in gone:
            logger.info(
                "%s version %d is no longer rejected (cleared by %s)", item.model, item.version, by
            )
        return gone

    def entries(self, model: str | None = None) -> list[RejectedVersion]:
        """Rejected versions by model then version.

        Args:
            model: One model, or None for all.

        Raises:
            CacheError: Bad name, or a database error.

        Returns:
            The rejections.
        """
        if model is not None:
            validate_model_name(model)
        return self._state.rejected(model)
