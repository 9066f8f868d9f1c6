"""Start-up recovery: make the files, the database and the served view agree after any crash.

Source of truth. Each fact has one commit point, and recovery rolls committed facts forward and
removes everything uncommitted:

    * a version's files are committed by the rename `staging/X → versions/MODEL/V-D12`
      (done only after every file and directory was fsynced);
    * a state change (ready, active, retired, failed) is committed by its SQLite transaction;
    * the served view is DERIVED data: it is rebuilt from the database whenever it differs.

The database is the source of truth for what is served because it is the only place that is
transactional across models and also knows what must NOT be served (failed versions, reasons),
which a symlink tree cannot express. `activate` swaps the view before it commits the database,
so the database commit is activation's commit point: a crash between the two leaves the view
ahead of the database, and recovery swaps the old view back. Either way a complete version is
served, never a half one.

Rules, applied in this order (each idempotent, so a crash during recovery is harmless):

    1. Empty `staging/`, `blobs/.tmp/` and temp symlinks: never committed.
    2. `staged` rows: folder renamed in and verified → `ready` (rolled forward: the rename
       committed the files, and re-downloading would cost more); otherwise → `failed`.
    3. Version folders with no row for that model, version and digest are removed (an evict
       commits in the database first, so such a folder is garbage).
    4. `ready`/`active`/`retired` rows without their folder → `failed`.
    5. `ready` and `active` versions are verified against their manifests (deep re-hash unless
       disabled); mismatches → `failed` with the reason, and their corrupt blobs are deleted.
    6. A model whose active version failed in step 5 falls back to its most recently used
       `retired` version that verifies (event `auto-rollback`); with none, it is not served.
    7. The view is rebuilt from the `active` rows if it differs, and old generations pruned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from model_cache.atomic import remove_tree
from model_cache.blobs import BlobStore
from model_cache.layout import CacheLayout, parse_version_dirname
from model_cache.records import COMMITTED, VersionRecord, VersionState
from model_cache.state import StateDB
from model_cache.verify import VerifyResult, verify_version
from model_cache.view import RepositoryView, ServedVersion

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What one recovery pass found and did.

    Attributes:
        removed_temp: Staging folders, blob temp files and temp symlinks removed.
        removed_orphans: Version folders removed because no row claims them (relative paths).
        promoted: (model, version) rolled forward from staged to ready.
        failed: (model, version, reason) marked failed in this pass.
        fallbacks: (model, failed version, version now active or None).
        view_rebuilt: Whether the served view had to be rebuilt.
        served: model → version served after recovery.
        verified: (model, version, digest) deep-verified in this pass.
    """

    removed_temp: int
    removed_orphans: tuple[str, ...]
    promoted: tuple[tuple[str, int], ...]
    failed: tuple[tuple[str, int, str], ...]
    fallbacks: tuple[tuple[str, int, int | None], ...]
    view_rebuilt: bool
    served: dict[str, int]
    verified: frozenset[tuple[str, int, str]]


def recency(record: VersionRecord) -> tuple[float, int]:
    """Sort key: most recently used last (ties broken by version number)."""
    return record.last_used, record.version


class _Recovery:
    def __init__(
        self, layout: CacheLayout, state: StateDB, blobs: BlobStore, view: RepositoryView
    ) -> None:
        self.layout, self.state, self.blobs, self.view = layout, state, blobs, view
        self.blob_results: dict[str, bool] = {}
        self.failed: list[tuple[str, int, str]] = []
        self.verified: set[tuple[str, int, str]] = set()

    def check(self, record: VersionRecord, *, deep: bool) -> VerifyResult:
        result = verify_version(
            self.layout,
            self.blobs,
            record.model,
            record.version,
            record.digest,
            deep=deep,
            blob_results=self.blob_results,
        )
        for digest in sorted(result.corrupt_blobs):
            logger.error("Deleting corrupt blob sha256:%s", digest)
            self.blobs.remove(digest)
        if result.ok and deep:
            self.verified.add((record.model, record.version, record.digest))
        return result

    def fail(self, record: VersionRecord, reason: str) -> None:
        logger.error("%s version %d failed: %s", record.model, record.version, reason)
        self.state.set_state(
            record.model, record.version, VersionState.FAILED, reason, detail={"recovery": True}
        )
        self.failed.append((record.model, record.version, reason))

    def remove_orphans(self) -> list[str]:
        wanted = {(r.model, r.version, r.digest[:12]) for r in self.state.versions()}
        removed: list[str] = []
        if not self.layout.versions_dir.is_dir():
            return removed
        for model_dir in sorted(self.layout.versions_dir.iterdir()):
            if not model_dir.is_dir() or model_dir.is_symlink():
                remove_tree(model_dir)
                removed.append(model_dir.name)
                continue
            for entry in sorted(model_dir.iterdir()):
                parsed = parse_version_dirname(entry.name)
                if parsed is None or (model_dir.name, *parsed) not in wanted:
                    remove_tree(entry)
                    removed.append(f"{model_dir.name}/{entry.name}")
        return removed

    def fallback(self, model: str, failed_version: int) -> int | None:
        retired = self.state.versions(model, [VersionState.RETIRED])
        for record in sorted(retired, key=recency, reverse=True):
            result = self.check(record, deep=True)
            if not result.ok:
                self.fail(record, result.reason or "verification failed")
                continue
            self.state.activate(
                model,
                record.version,
                kind="auto-rollback",
                detail={"failed": failed_version},
            )
            return record.version
        self.state.add_event("unserved", model, None, {"failed": failed_version})
        return None


def recover(
    layout: CacheLayout,
    state: StateDB,
    blobs: BlobStore,
    view: RepositoryView,
    *,
    deep: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> RecoveryReport:
    """Run the recovery rules (module docstring) once. The caller holds the cache lock.

    Args:
        layout: Paths of the cache root.
        state: The state database.
        blobs: The blob store.
        view: The served view.
        deep: Re-hash ready and active versions (False: structure and sizes only).
        on_step: Called with each rule's name as it starts (for logs and tests).

    Raises:
        CacheError: An I/O or database error stopped recovery; running it again is safe.

    Returns:
        What was found and done.
    """
    step = on_step or (lambda _name: None)
    run = _Recovery(layout, state, blobs, view)

    step("clear-temp")
    removed_temp = blobs.clear_temp()
    if layout.staging_dir.is_dir():
        for entry in sorted(layout.staging_dir.iterdir()):
            removed_temp += remove_tree(entry)

    step("staged")
    promoted: list[tuple[str, int]] = []
    for record in state.versions(states=[VersionState.STAGED]):
        result = run.check(record, deep=True)
        if result.ok:
            state.set_state(record.model, record.version, VersionState.READY, kind="recovered")
            promoted.append((record.model, record.version))
        else:
            run.fail(record, f"install interrupted: {result.reason}")

    step("orphans")
    orphans = run.remove_orphans()

    step("verify")
    fallen: list[VersionRecord] = []
    for record in state.versions(states=sorted(COMMITTED, key=lambda s: s.value)):
        checked = record.state is not VersionState.RETIRED
        result = run.check(record, deep=deep and checked)
        if result.ok:
            continue
        run.fail(record, result.reason or "verification failed")
        if record.state is VersionState.ACTIVE:
            fallen.append(record)

    step("fallback")
    fallbacks = [(r.model, r.version, run.fallback(r.model, r.version)) for r in fallen]

    step("view")
    active = state.versions(states=[VersionState.ACTIVE])
    served = [ServedVersion(r.model, r.version, r.digest) for r in active]
    rebuilt = not view.matches(served)
    if rebuilt:
        view.swap(view.build(served))
        state.add_event("view-rebuilt", detail={"served": {r.model: r.version for r in active}})
    removed_temp += view.prune(keep=1)

    return RecoveryReport(
        removed_temp=removed_temp,
        removed_orphans=tuple(orphans),
        promoted=tuple(promoted),
        failed=tuple(run.failed),
        fallbacks=tuple(fallbacks),
        view_rebuilt=rebuilt,
        served={r.model: r.version for r in active},
        verified=frozenset(run.verified),
    )
