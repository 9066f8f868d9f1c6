"""Putting versions on disk and taking them off: install, uninstall, unreferenced blobs.

Installing a version: blobs → staged row → staging folder → rename → ready.

    1. hash and store every source file in the blob store       → "blobs-written"
    2. record the version `staged` with its files (one txn)     → "db-staged"
    3. build `staging/X/`: hard links to the blobs, manifest,
       fsync everything, inner directories read-only           → "staged"
    4. rename `staging/X` → `versions/MODEL/V-D12`, fsync       → "renamed"
    5. record `ready` (one txn)                                  → "db-ready"

The name after each step is passed to the fault hook once the step is done. A crash after step 1
leaves unreferenced blobs (GC removes them); after 2 or 3 a staged row without its folder
(recovery marks it failed, staging is emptied); after 4 a staged row with a complete folder
(recovery verifies it and rolls it forward to ready).

Invariants:
    * Hashing and copying run without the cache lock; the digests written so far are pinned so
      GC cannot delete them before the staged row references them.
    * The rename in step 4 is the only way a folder appears under `versions/`, and it happens
      after everything inside was fsynced, so a folder there is complete or absent.
    * A cache error in steps 3 and 4 marks the version failed with the reason and removes the
      staging folder; an exception from the fault hook is a crash and skips all clean-up.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from model_cache.atomic import (
    READ_ONLY_DIR,
    READ_ONLY_FILE,
    atomic_write_bytes,
    durable_rename,
    ensure_dir,
    fsync_dir,
    fsync_tree,
    remove_tree,
    set_tree_dirs_mode,
)
from model_cache.blobs import BlobStore, hash_file
from model_cache.errors import CacheError, CacheFullError, InvalidVersionError, translate_os_error
from model_cache.layout import MANIFEST_NAME, CacheLayout, parse_version_dirname
from model_cache.manifest import Manifest, ManifestEntry, SourceTree
from model_cache.records import COMMITTED, FileRecord, InstalledVersion, VersionState
from model_cache.state import StateDB

logger = logging.getLogger(__name__)

#: Called with a step name after each step; raising (or dying) there simulates a crash.
FaultHook = Callable[[str], None]

INSTALL_STEPS = ("blobs-written", "db-staged", "staged", "renamed", "db-ready")


def no_fault(_step: str) -> None:
    """The default fault hook: does nothing."""


def remove_version_folders(layout: CacheLayout, model: str, version: int) -> int:
    """Remove every folder of one version number of a model (any digest).

    Args:
        layout: Paths of the cache root.
        model: Model name.
        version: Version number.

    Returns:
        How many folders were removed.
    """
    removed = 0
    model_dir = layout.model_dir(model)
    if model_dir.is_dir():
        for entry in sorted(model_dir.iterdir()):
            parsed = parse_version_dirname(entry.name)
            if parsed is not None and parsed[0] == version:
                removed += remove_tree(entry)
    return removed


class VersionInstaller:
    """Runs installs for a `ModelCache`, sharing its lock, database and blob store.

    Args:
        layout: Paths of the cache root.
        state: The state database.
        blobs: The blob store.
        lock: The cache's lock (held only around state changes).
        verified: The cache's set of versions verified in this process; installs add to it.
        max_version_bytes: Refuse versions larger than this.
        disk_budget_bytes: Refuse installs that would push blob bytes past this.
    """

    def __init__(
        self,
        layout: CacheLayout,
        state: StateDB,
        blobs: BlobStore,
        lock: threading.RLock,
        verified: set[tuple[str, int, str]],
        *,
        max_version_bytes: int | None,
        disk_budget_bytes: int | None,
    ) -> None:
        self._layout, self._state, self._blobs = layout, state, blobs
        self._lock, self._verified = lock, verified
        self._max_bytes, self._budget = max_version_bytes, disk_budget_bytes
        self._running: set[tuple[str, int]] = set()
        self._pins: Counter[str] = Counter()

    @property
    def busy(self) -> bool:
        """Whether an install is running in this process."""
        with self._lock:
            return bool(self._running)

    def pinned_digests(self) -> frozenset[str]:
        """Blobs written by running installs that no row references yet (GC must keep them)."""
        with self._lock:
            return frozenset(d for d, n in self._pins.items() if n > 0)

    def uninstall(self, model: str, version: int, *, reason: str) -> None:
        """Delete a version: its row first (one transaction, with an `evicted` event), then its
        folder. A crash between the two leaves a folder no row claims, which recovery removes.
        Blobs it used stay until `remove_unreferenced_blobs`.

        Args:
            model: Model name.
            version: Version number.
            reason: Recorded in the event.

        Raises:
            VersionNotFoundError: No such version.
            InvalidVersionError: The version is active or staged.
            CacheError: I/O or database error.
        """
        with self._lock:
            record = self._state.require(model, version)
            if record.state in {VersionState.ACTIVE, VersionState.STAGED}:
                raise InvalidVersionError(
                    f"{model} version {version} is {record.state.value}; not evicting it",
                    model=model,
                    version=version,
                )
            self._state.delete_version(model, version, detail={"reason": reason})
            self._verified.discard((model, version, record.digest))
            with translate_os_error("evict", model=model, version=version):
                remove_version_folders(self._layout, model, version)
        logger.info("Evicted %s version %d (%s)", model, version, reason)

    def remove_unreferenced_blobs(self) -> tuple[int, int]:
        """Delete blobs that no non-failed version uses and no running install has pinned.

        Returns:
            (blobs removed, bytes freed).
        """
        with self._lock:
            keep = self._state.referenced_digests() | self.pinned_digests()
            removed = freed = 0
            for digest in self._blobs.digests():
                if digest not in keep:
                    freed += self._blobs.remove(digest)
                    removed += 1
            return removed, freed

    def install(
        self, model: str, version: int, tree: SourceTree, hook: FaultHook
    ) -> InstalledVersion:
        """Install a checked source tree (see the module docstring for the steps).

        Args:
            model: Model name (validated).
            version: Version number (validated).
            tree: The checked source (`manifest.scan_source`).
            hook: Fault hook, called after each of `INSTALL_STEPS`.

        Raises:
            InvalidVersionError: The version exists with other content.
            CacheFullError: Over the size cap or disk budget, or the disk is full.
            CacheError: The same version is being installed, or an I/O error.

        Returns:
            The version, ready (or as it was, when the same content was already installed).
        """
        self._check_size(model, version, tree)
        with self._lock:
            if (model, version) in self._running:
                raise CacheError("install already in progress", model=model, version=version)
            self._running.add((model, version))
        pinned: list[str] = []
        try:
            return self._install(model, version, tree, hook, pinned)
        finally:
            with self._lock:
                self._running.discard((model, version))
                self._pins.subtract(pinned)

    def _install(
        self, model: str, version: int, tree: SourceTree, hook: FaultHook, pinned: list[str]
    ) -> InstalledVersion:
        entries = []
        for item in tree.files:
            digest = self._blobs.put_file(item.source, max_bytes=self._max_bytes)
            with self._lock:
                self._pins[digest] += 1
            pinned.append(digest)
            entries.append(ManifestEntry(item.path, digest, self._blobs.size(digest)))
        manifest = Manifest.build(model, version, list(tree.dirs), entries)
        hook("blobs-written")
        with self._lock:
            existing = self._claim(model, version, manifest.digest)
            if existing is not None:
                return existing
            files = [FileRecord(e.path, e.digest, e.size) for e in manifest.files]
            self._state.record_staged(model, version, manifest.digest, files)
        hook("db-staged")
        staging = self._guard(model, version, lambda: self._stage(manifest))
        hook("staged")
        dest = self._layout.version_dir(model, version, manifest.digest)
        self._guard(model, version, lambda: _commit_folder(staging, dest))
        hook("renamed")
        with self._lock:
            record = self._state.set_state(model, version, VersionState.READY)
            self._verified.add((model, version, manifest.digest))
        logger.info("Installed %s version %d sha256:%s", model, version, manifest.digest)
        hook("db-ready")
        return InstalledVersion.from_record(record, dest)

    def _check_size(self, model: str, version: int, tree: SourceTree) -> None:
        total = tree.total_bytes
        if self._max_bytes is not None and total > self._max_bytes:
            raise CacheFullError(
                f"version is {total} bytes, over the {self._max_bytes}-byte cap",
                needed_bytes=total,
                model=model,
                version=version,
            )
        if self._budget is None:
            return
        with translate_os_error("check disk budget", model=model, version=version):
            usage = self._blobs.total_bytes()
            if usage + total <= self._budget:
                return
            # Near the budget: only content not stored yet counts (costs one extra read).
            new: dict[str, int] = {}
            for item in tree.files:
                digest, size = hash_file(item.source)
                if not self._blobs.has(digest):
                    new[digest] = size
        needed = sum(new.values())
        if usage + needed > self._budget:
            raise CacheFullError(
                f"{needed} new bytes would exceed the disk budget "
                f"({usage} of {self._budget} used); run GC first",
                needed_bytes=needed,
                budget_bytes=self._budget,
                model=model,
                version=version,
            )

    def _claim(self, model: str, version: int, digest: str) -> InstalledVersion | None:
        existing = self._state.get(model, version)
        if existing is None:
            return None
        path = self._layout.version_dir(model, version, existing.digest)
        if existing.digest == digest and existing.state in COMMITTED and path.is_dir():
            return InstalledVersion.from_record(existing, path)
        if existing.state is VersionState.STAGED:
            raise CacheError(
                f"an install of {model} version {version} was interrupted; reopen the cache "
                "so that recovery settles it",
                model=model,
                version=version,
            )
        if existing.state is not VersionState.FAILED:
            raise InvalidVersionError(
                f"{model} version {version} is already installed with other content "
                f"(sha256:{existing.digest[:12]}, {existing.state.value})",
                model=model,
                version=version,
                digest=existing.digest,
            )
        with translate_os_error("remove failed version", model=model, version=version):
            remove_version_folders(self._layout, model, version)
        return None

    def _guard(self, model: str, version: int, action: Callable[[], Path]) -> Path:
        """Run an install step; on a cache error mark the version failed, then re-raise."""
        try:
            with translate_os_error("install", model=model, version=version):
                return action()
        except CacheError as exc:
            with self._lock:
                reason = f"install failed: {exc.message}"
                self._state.set_state(model, version, VersionState.FAILED, reason)
            raise

    def _stage(self, manifest: Manifest) -> Path:
        staging = ensure_dir(self._layout.staging_dir) / secrets.token_hex(8)
        staging.mkdir()
        try:
            for directory in manifest.dirs:
                (staging / directory).mkdir(parents=True, exist_ok=True)
            for entry in manifest.files:
                os.link(self._blobs.path_of(entry.digest), staging / entry.path)
            atomic_write_bytes(staging / MANIFEST_NAME, manifest.to_bytes(), mode=READ_ONLY_FILE)
            fsync_tree(staging)
            set_tree_dirs_mode(staging, READ_ONLY_DIR, include_root=False)
        except OSError:
            remove_tree(staging)
            raise
        return staging


def _commit_folder(staging: Path, dest: Path) -> Path:
    try:
        ensure_dir(dest.parent)
        remove_tree(dest)  # Only a leftover that no row claims can be here.
        durable_rename(staging, dest)
    except OSError:
        remove_tree(staging)
        raise
    os.chmod(dest, READ_ONLY_DIR)
    fsync_dir(dest.parent)
    return dest
