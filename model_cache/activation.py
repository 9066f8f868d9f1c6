"""Changing what is served: activate, roll back, deactivate.

Every change follows the same three steps, each reported to the fault hook once done:

    1. build a new, complete view generation serving the wanted versions   → "view-built"
    2. swap the `repository` symlink onto it (one rename, fsynced)           → "view-swapped"
    3. commit the new states and the event in one SQLite transaction        → "db-active"

The database commit (3) is the commit point. A crash before it leaves the database describing
the old state; recovery, which derives the view from the database, swaps the old view back if
step 2 had already happened. A crash after it is a completed activation. Rolling the view back
rather than the database forward is deliberate: the caller (the agent's hot swap) never saw the
activation succeed, so after a restart it sees the state it last saw confirmed.

Invariants:
    * A version is verified in this process before it is first served (`ensure_verified`): the
      install that created it, recovery at open, or a re-hash here (e.g. on rollback).
    * When the database refuses the commit, the view the database describes is put back before
      the error propagates, so the served view never runs ahead of the database for long.
    * Only the cache's own errors trigger clean-up; a fault hook's exception is a crash.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from model_cache.blobs import BlobStore
from model_cache.errors import (
    CacheError,
    CorruptBlobError,
    InvalidVersionError,
    VersionNotFoundError,
    translate_os_error,
)
from model_cache.install import FaultHook
from model_cache.layout import CacheLayout
from model_cache.records import ACTIVATABLE, VersionRecord, VersionState
from model_cache.recovery import recency
from model_cache.state import StateDB
from model_cache.verify import verify_version
from model_cache.view import RepositoryView, ServedVersion

logger = logging.getLogger(__name__)

ACTIVATE_STEPS = ("view-built", "view-swapped", "db-active")


class Activator:
    """Serves versions for a `ModelCache`, sharing its lock, database, blobs and view.

    Args:
        layout: Paths of the cache root.
        state: The state database.
        blobs: The blob store.
        view: The served view.
        lock: The cache's lock; every method holds it.
        verified: The cache's set of (model, version, digest) verified in this process.
    """

    def __init__(
        self,
        layout: CacheLayout,
        state: StateDB,
        blobs: BlobStore,
        view: RepositoryView,
        lock: threading.RLock,
        verified: set[tuple[str, int, str]],
    ) -> None:
        self._layout, self._state, self._blobs, self._view = layout, state, blobs, view
        self._lock, self._verified = lock, verified

    def activate(
        self,
        model: str,
        version: int,
        hook: FaultHook,
        *,
        kind: str = "activated",
        detail: Mapping[str, object] | None = None,
    ) -> VersionRecord:
        """Serve one version of a model, keeping the other models' active versions.

        Args:
            model: Model name (validated).
            version: Version number (validated).
            hook: Fault hook, called after each of `ACTIVATE_STEPS`.
            kind: Event kind (`activated`, `rolled-back`).
            detail: Extra event fields.

        Raises:
            VersionNotFoundError: No such version.
            InvalidVersionError: The version is failed or still staged.
            CorruptBlobError: It fails verification (and is now marked failed).
            CacheError: I/O or database error; the database's view is served.

        Returns:
            The version's row, now active.
        """
        with self._lock:
            record = self._state.require(model, version)
            if record.state not in ACTIVATABLE:
                why = f": {record.reason}" if record.reason else ""
                raise InvalidVersionError(
                    f"{model} version {version} is {record.state.value}{why}",
                    model=model,
                    version=version,
                )
            self.ensure_verified(record)
            served = {r.model: r for r in self._state.versions(states=[VersionState.ACTIVE])}
            served[model] = record
            if record.state is VersionState.ACTIVE and self._view.matches(_wanted(served)):
                return record
            self._switch(model, version, hook, _wanted(served))
            try:
                self._state.activate(model, version, kind=kind, detail=detail)
            except CacheError:
                self.serve_database_view()
                raise
            hook("db-active")
            self._prune()
            logger.info("%s: %s version %d sha256:%s", kind, model, version, record.digest)
            return self._state.require(model, version)

    def rollback_target(self, model: str) -> int:
        """The version `rollback` goes back to by default: the most recently used retired one.

        Args:
            model: Model name.

        Raises:
            VersionNotFoundError: Nothing is retained.

        Returns:
            A version number.
        """
        retired = self._state.versions(model, [VersionState.RETIRED])
        if not retired:
            raise VersionNotFoundError(
                f"{model} has no retained version to roll back to", model=model
            )
        return max(retired, key=recency).version

    def deactivate(self, model: str, hook: FaultHook) -> VersionRecord | None:
        """Stop serving a model; its active version becomes retired.

        Args:
            model: Model name (validated).
            hook: Fault hook, called after each of `ACTIVATE_STEPS`.

        Raises:
            CacheError: I/O or database error; the database's view is served.

        Returns:
            The version's row, now retired, or None when nothing was active.
        """
        with self._lock:
            current = self._state.active_version(model)
            if current is None:
                return None
            served = {r.model: r for r in self._state.versions(states=[VersionState.ACTIVE])}
            del served[model]
            self._switch(model, current.version, hook, _wanted(served))
            try:
                self._state.set_state(
                    model, current.version, VersionState.RETIRED, kind="deactivated"
                )
            except CacheError:
                self.serve_database_view()
                raise
            hook("db-active")
            self._prune()
            return self._state.require(model, current.version)

    def ensure_verified(self, record: VersionRecord, *, force: bool = False) -> None:
        """Re-hash a version unless it was verified in this process already.

        Args:
            record: The version's row.
            force: Re-hash even if it was verified before.

        Raises:
            CorruptBlobError: It does not match its manifest; it is now marked failed, and its
                corrupt blobs are deleted.
        """
        key = (record.model, record.version, record.digest)
        if key in self._verified and not force:
            return
        self._verified.discard(key)
        result = verify_version(
            self._layout, self._blobs, record.model, record.version, record.digest
        )
        for digest in sorted(result.corrupt_blobs):
            self._blobs.remove(digest)
        if result.reason is not None:
            self._state.set_state(record.model, record.version, VersionState.FAILED, result.reason)
            raise CorruptBlobError(
                f"{record.model} version {record.version} failed verification: {result.reason}",
                model=record.model,
                version=record.version,
                digest=record.digest,
            )
        self._verified.add(key)

    def serve_database_view(self) -> None:
        """Make the served view match the database's active versions (rebuild if it differs).

        Raises:
            CacheError: I/O error.
        """
        with self._lock:
            active = {r.model: r for r in self._state.versions(states=[VersionState.ACTIVE])}
            with translate_os_error("restore view"):
                if not self._view.matches(_wanted(active)):
                    self._view.swap(self._view.build(_wanted(active)))

    def _switch(
        self, model: str, version: int, hook: FaultHook, wanted: list[ServedVersion]
    ) -> None:
        with translate_os_error("build view", model=model, version=version):
            name = self._view.build(wanted)
        hook("view-built")
        with translate_os_error("swap view", model=model, version=version):
            try:
                self._view.swap(name)
            except BaseException:
                self._view.discard(name)
                raise
        hook("view-swapped")

    def _prune(self) -> None:
        with translate_os_error("prune views"):
            self._view.prune(keep=2)


def _wanted(served: Mapping[str, VersionRecord]) -> list[ServedVersion]:
    return [ServedVersion(r.model, r.version, r.digest) for r in served.values()]
