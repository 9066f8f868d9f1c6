"""`ModelCache`: install, activate, roll back and list model versions under one cache root.

    cache = ModelCache(Path("/var/lib/edge-agent"))          # opens, locks, recovers
    v2 = cache.install("resnet", 2, Path("incoming/resnet"))  # staged → ready
    cache.activate("resnet", 2)                              # served at cache.repository_path
    cache.rollback("resnet")                                 # back to the previous version

The steps of an install are in `install.py`, of an activation in `activation.py`, and what a
restart does after a crash at any of them in `recovery.py`.

Invariants:
    * One process owns a cache root (an exclusive flock on `ROOT/lock`); within it, one lock
      serializes state changes. Hashing and copying during install run outside that lock.
    * Nothing is served that was not verified in this process: recovery verifies ready and
      active versions at open (re-hash; only structure and sizes with `verify_on_open=False`),
      install verifies by construction, and activating anything else (e.g. rolling back to a
      retired version) re-hashes it first.
    * A version number is immutable: re-installing it with other content is refused unless the
      old one failed. Installing the same content again returns the existing version.
    * Exceptions raised by a fault hook propagate untouched and skip all clean-up, exactly like
      a crash; only the cache's own errors trigger clean-up.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model_cache.activation import Activator
from model_cache.atomic import ensure_dir, lock_exclusive
from model_cache.blobs import BlobStore
from model_cache.errors import CacheError, CorruptBlobError, translate_os_error
from model_cache.install import FaultHook, VersionInstaller, no_fault
from model_cache.layout import CacheLayout, validate_model_name, validate_version
from model_cache.manifest import scan_source
from model_cache.records import CacheEvent, InstalledVersion, VersionRecord, VersionState
from model_cache.recovery import RecoveryReport, recover
from model_cache.rejections import Rejections
from model_cache.state import StateDB
from model_cache.view import RepositoryView

logger = logging.getLogger(__name__)


class ModelCache:
    """The content-addressed model cache under one root directory.

    Opening takes the root's lock and runs `recover()`. Methods are thread-safe.

    Args:
        root: The cache root (created if missing).
        clock: "Now" in epoch seconds, for the database; injected for tests.
        verify_on_open: Re-hash ready and active versions during recovery (slower start, but
            catches bit rot and tampering before anything is served).
        max_version_bytes: Refuse versions whose files add up to more than this.
        disk_budget_bytes: Refuse installs that would push stored blobs past this.

    Raises:
        CacheError: Another process holds the root, or it cannot be opened or recovered.
    """

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        verify_on_open: bool = True,
        max_version_bytes: int | None = None,
        disk_budget_bytes: int | None = None,
    ) -> None:
        self._layout = CacheLayout(Path(root).absolute())
        self._lock = threading.RLock()
        self._verified: set[tuple[str, int, str]] = set()
        self._lock_fd = -1
        self._state: StateDB | None = None
        with translate_os_error(f"open cache {self._layout.root}"):
            ensure_dir(self._layout.root)
            self._lock_fd = lock_exclusive(self._layout.lock_file)
        if self._lock_fd < 0:
            raise CacheError(f"{self._layout.root} is in use by another process")
        try:
            with translate_os_error("open cache"):
                self._state = StateDB(self._layout.state_db, clock=clock)
                self._blobs = BlobStore(self._layout)
                self._view = RepositoryView(self._layout)
                ensure_dir(self._layout.staging_dir)
                ensure_dir(self._layout.versions_dir)
            self._installer = VersionInstaller(
                self._layout,
                self._state,
                self._blobs,
                self._lock,
                self._verified,
                max_version_bytes=max_version_bytes,
                disk_budget_bytes=disk_budget_bytes,
            )
            self._activator = Activator(
                self._layout, self._state, self._blobs, self._view, self._lock, self._verified
            )
            self._rejections = Rejections(self._state, self._lock)
            self.last_recovery = self.recover(deep=verify_on_open)
        except BaseException:
            self.close()
            raise

    @property
    def _db(self) -> StateDB:
        if self._state is None:
            raise CacheError("the cache is closed")
        return self._state

    @property
    def root(self) -> Path:
        """The cache root."""
        return self._layout.root

    @property
    def repository_path(self) -> Path:
        """The served Triton repository; the same path across swaps (do not `resolve()` it)."""
        return self._layout.repository

    @property
    def layout(self) -> CacheLayout:
        """Paths of the cache root."""
        return self._layout

    @property
    def blobs(self) -> BlobStore:
        """The blob store (e.g. to `put_stream` downloads before `install`)."""
        return self._blobs

    @property
    def rejections(self) -> Rejections:
        """Versions this device will not activate by itself (see `rejections.py`)."""
        return self._rejections

    @property
    def journal_mode(self) -> str:
        """The state database's journal mode (`wal`)."""
        return self._db.journal_mode

    def close(self) -> None:
        """Close the database and release the root's lock (as a process exit would). Idempotent."""
        with self._lock:
            if self._state is not None:
                self._state.close()
                self._state = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __enter__(self) -> ModelCache:
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the cache's lock across several calls (GC plans and evicts under it)."""
        with self._lock:
            yield

    def recover(self, *, deep: bool = True) -> RecoveryReport:
        """Make files, database and served view agree; see `model_cache.recovery`.

        Args:
            deep: Re-hash ready and active versions.

        Raises:
            CacheError: An install is running in this process, or recovery hit an I/O error.

        Returns:
            What was found and done.
        """
        with self._lock:
            if self._installer.busy:
                raise CacheError("cannot recover while an install is in progress")
            with translate_os_error("recover"):
                report = recover(self._layout, self._db, self._blobs, self._view, deep=deep)
            self._verified.clear()
            self._verified.update(report.verified)
        return report

    def install(
        self, model: str, version: int, source_dir: Path, fault: FaultHook | None = None
    ) -> InstalledVersion:
        """Install version `version` of `model` from a Triton model folder (see `install.py`).

        Args:
            model: Model name.
            version: Version number; `source_dir/VERSION/` is the version folder.
            source_dir: Holds `config.pbtxt` and `VERSION/` (other versions are ignored).
            fault: Called after each of `INSTALL_STEPS`.

        Raises:
            InvalidVersionError: Bad source, or the version exists with other content.
            CacheFullError: Over `max_version_bytes` or the disk budget, or the disk is full.
            CacheError: The same version is being installed, or an I/O error.

        Returns:
            The version, ready (or as it was, when the same content was already installed).
        """
        validate_model_name(model)
        validate_version(version)
        with translate_os_error(f"read {source_dir}", model=model, version=version):
            tree = scan_source(Path(source_dir), version)
        return self._installer.install(model, version, tree, fault or no_fault)

    def activate(
        self, model: str, version: int, fault: FaultHook | None = None
    ) -> InstalledVersion:
        """Serve `version` of `model` (and keep serving the other models' active versions).

        The previous active version becomes retired. See `activation.py` for the steps.

        Args:
            model: Model name.
            version: A ready, retired or already active version.
            fault: Called after each of `ACTIVATE_STEPS`.

        Raises:
            VersionNotFoundError: No such version.
            InvalidVersionError: The version is failed or still being installed.
            CorruptBlobError: Verification failed; the version is now marked failed.
            CacheError: I/O or database error; the previous view is served.

        Returns:
            The version, now active.
        """
        self._require(model, version)
        record = self._activator.activate(model, version, fault or no_fault)
        return self._installed(record)

    def rollback(
        self, model: str, to_version: int | None = None, fault: FaultHook | None = None
    ) -> InstalledVersion:
        """Re-activate a retained version without downloading anything.

        Args:
            model: Model name.
            to_version: The version to go back to; by default the most recently used retired
                version (so two rollbacks in a row swap back and forth).
            fault: Called after each of `ACTIVATE_STEPS`.

        Raises:
            VersionNotFoundError: No such version, or nothing retained to roll back to.
            InvalidVersionError: The target is failed.
            CorruptBlobError: The target fails verification (it is now marked failed).
            CacheError: I/O or database error.

        Returns:
            The version now active.
        """
        with self._lock:
            validate_model_name(model)
            target = self._activator.rollback_target(model) if to_version is None else to_version
            self._require(model, target)
            record = self._activator.activate(model, target, fault or no_fault, kind="rolled-back")
            return self._installed(record)

    def deactivate(self, model: str, fault: FaultHook | None = None) -> InstalledVersion | None:
        """Stop serving a model: its active version becomes retired.

        Args:
            model: Model name.
            fault: Called after each of `ACTIVATE_STEPS`.

        Raises:
            CacheError: I/O or database error.

        Returns:
            The version that was active (now retired), or None when none was.
        """
        record = self._activator.deactivate(validate_model_name(model), fault or no_fault)
        return self._installed(record) if record else None

    def _require(self, model: str, version: int) -> VersionRecord:
        return self._db.require(validate_model_name(model), validate_version(version))

    def _installed(self, record: VersionRecord) -> InstalledVersion:
        path = self._layout.version_dir(record.model, record.version, record.digest)
        return InstalledVersion.from_record(record, path)

    def get(self, model: str, version: int) -> InstalledVersion:
        """One version, in any state.

        Args:
            model: Model name.
            version: Version number.

        Raises:
            VersionNotFoundError: The cache has no such version.

        Returns:
            The version.
        """
        with self._lock:
            return self._installed(self._require(model, version))

    def list_versions(self, model: str) -> list[InstalledVersion]:
        """Every version of a model the cache knows, in any state, by version number.

        Args:
            model: Model name.

        Returns:
            The versions (empty for an unknown model).
        """
        records = self._db.versions(validate_model_name(model))
        return [self._installed(r) for r in records]

    def active_version(self, model: str) -> InstalledVersion | None:
        """The version of `model` being served, or None."""
        record = self._db.active_version(validate_model_name(model))
        return self._installed(record) if record else None

    def served(self) -> Mapping[str, InstalledVersion]:
        """model → active version: exactly what `repository_path` serves."""
        active = self._db.versions(states=[VersionState.ACTIVE])
        return {r.model: self._installed(r) for r in active}

    def models(self) -> list[str]:
        """Models with at least one version in the cache, sorted."""
        return sorted({r.model for r in self._db.versions()})

    def events(self, since_id: int = 0, limit: int = 1000) -> list[CacheEvent]:
        """The event log after `since_id`, oldest first (at most `limit` events)."""
        return self._db.events(since_id, limit)

    def record_event(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, Any]
    ) -> int:
        """Append an event that changes no cache state (e.g. the agent's swap outcomes).

        Returns:
            The event's id.
        """
        with self._lock:
            return self._db.add_event(kind, model, version, detail)

    def touch(self, model: str, version: int) -> None:
        """Mark a version as used now (GC evicts the least recently used first)."""
        self._db.touch(model, version)

    def verify(self, model: str, version: int) -> bool:
        """Re-hash a version now. A failing version is marked failed and no longer served.

        Args:
            model: Model name.
            version: Version number.

        Raises:
            VersionNotFoundError: No such version.
            CacheError: I/O or database error.

        Returns:
            True when the version matches its manifest.
        """
        with self._lock:
            record = self._require(model, version)
            try:
                self._activator.ensure_verified(record, force=True)
            except CorruptBlobError:
                self._activator.serve_database_view()
                return False
            return True

    def evict(self, model: str, version: int, *, reason: str) -> None:
        """Delete a version that is not active or staged (see `VersionInstaller.uninstall`).

        Raises:
            VersionNotFoundError: No such version.
            InvalidVersionError: The version is active or being installed.
            CacheError: I/O or database error.
        """
        self._require(model, version)
        self._installer.uninstall(model, version, reason=reason)

    def disk_usage(self) -> int:
        """Bytes held by blobs (each distinct content once; version folders share them)."""
        with self._lock, translate_os_error("measure disk usage"):
            return self._blobs.total_bytes()

    def remove_unreferenced_blobs(self) -> tuple[int, int]:
        """Delete blobs no non-failed version uses and no running install has pinned.

        Returns:
            (blobs removed, bytes freed).
        """
        return self._installer.remove_unreferenced_blobs()

    def prune_views(self) -> int:
        """Remove view generations other than the current and the previous one.

        Returns:
            How many entries were removed.
        """
        with self._lock, translate_os_error("prune views"):
            return self._view.prune(keep=2)
