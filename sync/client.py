"""Device sync: refresh TUF metadata, download verified targets, install them into the cache.

    client = SyncClient(store, cache, trusted_root=Path("root.json").read_bytes(),
                        work_dir=cache.root / "sync", desired=parse_desired(["*=latest"]))
    report = client.sync_once()          # SyncError when metadata cannot be trusted or fetched
    for model, version in report.activate:
        await cached_versions.activate(model, version)   # the agent's hot swap

One cycle, in order (nothing is installed before everything it depends on is verified):
    1. python-tuf's `Updater.refresh()` from the trusted root shipped to the device: root chain,
       timestamp, snapshot, targets (signatures, thresholds, expiry, rollback: all python-tuf).
    2. The verified target set is checked against our rules and planned (`sync/policy.py`),
       skipping the versions rejected on this device (`ModelCache.rejections`).
    3. Each file of each version to fetch is streamed into `WORK/downloads/SHA256.part`
       (`Downloader`: capped at its signed length, resumed with range requests), a few at a time,
       then python-tuf's `TargetFile.verify_length_and_hashes` accepts or refuses it
       (`sync/target_downloads.py`).
    4. A version whose files all verified has its OpenSSF model signature checked against their
       verified digests (`sync/model_signature.py`, policy off | warn | require); under
       `require` a failure rejects the version on this device (`SyncReport.refused`) and
       nothing is installed. Its provenance record is written (`sync/provenance.py`), then it
       is assembled as a Triton folder of hard links under `WORK/staging/` and handed to
       `ModelCache.install`, which hashes and stores it durably.
    5. The versions to serve are returned; activation (the hot swap) is the caller's.

Invariants:
    * A failure in steps 1-2 ends the cycle with nothing downloaded; in steps 3-4 it fails that
      version only (recorded in `SyncReport.errors`), and the cache's active versions are never
      touched by this module.
    * Per-cycle failures are returned, not logged above debug level: the caller decides what to
      report once (the periodic loop: one event when a failure starts, one when it ends).
    * Downloads and staging live in `work_dir`, never inside the cache's own folders; staging is
      removed after every install attempt, and part files survive only to be resumed.
    * Only top-level targets are used (no delegations); the listing read from the metadata
      folder is only a list of names, each looked up again in the Updater's verified set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import Metadata, Root, TargetFile, Targets
from tuf.ngclient import Updater, UpdaterConfig

from model_cache import (
    CacheError,
    CacheFullError,
    ModelCache,
    RejectedVersion,
    RejectionCause,
    VersionState,
)
from model_cache.atomic import ensure_dir, remove_tree, temp_name
from sync.errors import (
    DiskFullError,
    DownloadError,
    InstallError,
    MetadataError,
    SyncError,
    VerificationError,
)
from sync.fetcher import Downloader, StoreFetcher
from sync.model_signature import SignatureCheck, SignaturePolicy, Verdict
from sync.policy import CachedVersion, Choice, Desired, SignedVersion, group_targets, plan
from sync.provenance import Provenance, ProvenanceStore
from sync.publish import METADATA_PREFIX
from sync.store import ObjectStore
from sync.target_downloads import NO_SPACE, Progress, TargetDownloads

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """The outcome of one cycle."""

    installed: tuple[tuple[str, int], ...] = ()
    activate: tuple[tuple[str, int], ...] = ()
    errors: tuple[tuple[str, str], ...] = ()  # (model, reason): that model was not updated
    downloaded_bytes: int = 0
    resumed_bytes: int = 0
    transient: bool = False  # a download failed in transport: worth retrying sooner
    choices: tuple[Choice, ...] = ()  # per model: the version the policy serves, and why
    refused: tuple[tuple[str, int, str], ...] = ()  # (model, version, why): OMS check, rejected
    unverified: tuple[tuple[str, int, str], ...] = ()  # (model, version, why): installed (warn)


class SyncClient:
    """Keeps the cache in line with the signed repository and the desired state.

    Args:
        store: Where the repository lives.
        cache: The model cache to install into.
        trusted_root: Root metadata bytes shipped with the device (the trust anchor).
        work_dir: Folder for TUF metadata, part files and staging (e.g. `CACHE/sync`).
        desired: Per-model version policy (`policy.parse_desired`).
        max_parallel: Target files downloaded at once.
        max_version_bytes: Refuse versions whose signed files add up to more.
        downloader: Streams target files (injected to simulate faults).
        progress: Called with byte counts while downloading (from worker threads).
        updater_config: python-tuf's limits (metadata size caps, root rotations).
        signatures: The OMS policy and trusted keys (`sync/model_signature.py`); a version
            that fails the check under `require` is rejected on this device, never installed.
        provenance: Where each installed version's signer is recorded (default
            `work_dir/provenance`).
    """

    def __init__(
        self,
        store: ObjectStore,
        cache: ModelCache,
        trusted_root: bytes,
        work_dir: Path,
        desired: Mapping[str, Desired],
        *,
        max_parallel: int = 3,
        max_version_bytes: int = 8 * 1024**3,
        downloader: Downloader | None = None,
        progress: Callable[[Progress], None] = lambda _p: None,
        updater_config: UpdaterConfig | None = None,
        signatures: SignatureCheck | None = None,
        provenance: ProvenanceStore | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._root = trusted_root
        self._work = work_dir
        self._desired = dict(desired)
        self._max_version = max_version_bytes
        self._downloads = TargetDownloads(
            downloader or Downloader(store),
            work_dir,
            max_parallel=max_parallel,
            progress=progress,
        )
        self._tuf_config = updater_config or UpdaterConfig()
        self._consistent = True  # from the verified root, at each refresh
        self._signatures = signatures or SignatureCheck()
        self.provenance = provenance or ProvenanceStore(work_dir / "provenance")

    @property
    def metadata_dir(self) -> Path:
        """Where the trusted TUF metadata lives (`work_dir/metadata`)."""
        return self._work / "metadata"

    def set_desired(self, desired: Mapping[str, Desired]) -> None:
        """Replace the per-model version policy; the next cycle plans with it.

        Args:
            desired: As `policy.parse_desired` returns it (the fleet's `set-desired`).
        """
        self._desired = dict(desired)  # one reference swap: a cycle in progress keeps its copy

    def sync_once(self) -> SyncReport:
        """Run one cycle (see the module docstring).

        Raises:
            MetadataError: Metadata failed verification (signatures, threshold, expiry,
                rollback); nothing was downloaded.
            UnsafeTargetError: Signed targets break the rules of `sync/policy.py`.
            DownloadError: Metadata could not be fetched (store unreachable).
            SyncError: The work folder cannot be written.

        Returns:
            Installed versions, versions to activate, and per-model refusals.
        """
        targets = self._refresh()
        signed = group_targets(targets)
        cached = {m: self._cached(m) for m in self._cache.models()}
        rejected: dict[str, dict[int, str]] = {}
        for refused in self._rejected():
            rejected.setdefault(refused.model, {})[refused.version] = refused.reason
        todo = plan(signed, self._desired, cached, rejected)
        errors = list(todo.errors)
        fetch: list[SignedVersion] = []
        for item in todo.fetch:
            if item.total_bytes > self._max_version:
                errors.append(
                    (
                        item.model,
                        f"version {item.version} is {item.total_bytes} bytes, "
                        f"over the {self._max_version}-byte cap",
                    )
                )
            else:
                fetch.append(item)
        files, tally = self._downloads.fetch(fetch, errors, consistent=self._consistent)
        installed: list[tuple[str, int]] = []
        refusals: list[tuple[str, int, str]] = []
        unverified: list[tuple[str, int, str]] = []
        for item in fetch:
            if all(f.target.hashes["sha256"] in files for f in item.downloads):
                try:
                    verdict = self._check_signature(item, files)
                    failed = (item.model, item.version, verdict.reason)
                    if not verdict.ok and self._signatures.policy is SignaturePolicy.REQUIRE:
                        self._refuse(item, verdict)
                        refusals.append(failed)  # rejected, not installed
                        continue
                    self._record(item, verdict)
                    try:
                        self._install(item, files)
                    except SyncError:
                        # The record went first so that no installed version lacks one; a
                        # version that did not install keeps none.
                        self.provenance.forget(item.model, item.version)
                        raise
                    installed.append((item.model, item.version))
                    if not verdict.ok:
                        unverified.append(failed)  # installed anyway ("warn")
                except SyncError as exc:
                    logger.debug(
                        "install of %s version %d failed: %s", item.model, item.version, exc
                    )
                    errors.append((item.model, exc.message))
        for path in files.values():
            path.unlink(missing_ok=True)
        usable = {(m, c.version) for m in self._cache.models() for c in self._cached(m)}
        activate = tuple(pair for pair in todo.activate if pair in usable)
        for model, reason in errors:
            logger.debug("sync: %s: %s", model, reason)
        return SyncReport(
            tuple(installed),
            activate,
            tuple(errors),
            tally.done,
            tally.resumed,
            tally.transient,
            todo.choices,
            tuple(refusals),
            tuple(unverified),
        )

    def _refresh(self) -> dict[str, TargetFile]:
        meta_dir = self.metadata_dir
        try:
            ensure_dir(meta_dir)
            updater = Updater(
                str(meta_dir),
                self._store.url + METADATA_PREFIX,
                fetcher=StoreFetcher(self._store),
                config=self._tuf_config,
                bootstrap=self._root,
            )
            updater.refresh()
            listing = Metadata[Targets].from_bytes((meta_dir / "targets.json").read_bytes())
            root = Metadata[Root].from_bytes((meta_dir / "root.json").read_bytes())
            self._consistent = bool(root.signed.consistent_snapshot)
            targets: dict[str, TargetFile] = {}
            for path in listing.signed.targets:
                info = updater.get_targetinfo(path)
                if info is None:
                    raise MetadataError(
                        f"target {path!r} is not in the verified targets", path=path
                    )
                targets[path] = info
        except tuf_exceptions.RepositoryError as exc:
            raise MetadataError(
                f"repository metadata refused: {type(exc).__name__}: {exc}"
            ) from None
        except tuf_exceptions.DownloadError as exc:
            cause = exc.__cause__ or exc
            raise DownloadError(f"cannot fetch metadata from {self._store.url}: {cause}") from None
        except OSError as exc:
            raise SyncError(f"cannot write TUF metadata in {meta_dir}: {exc}") from None
        except ValueError as exc:
            raise MetadataError(f"malformed metadata: {exc}") from None
        return targets

    def _rejected(self) -> list[RejectedVersion]:
        try:
            return self._cache.rejections.entries()
        except CacheError as exc:
            raise SyncError(f"cannot read the rejected versions: {exc.message}") from None

    def _cached(self, model: str) -> list[CachedVersion]:
        return [
            CachedVersion(v.version, v.digest, v.state is VersionState.ACTIVE)
            for v in self._cache.list_versions(model)
            if v.state in (VersionState.READY, VersionState.ACTIVE, VersionState.RETIRED)
        ]

    def _install(self, item: SignedVersion, files: Mapping[str, Path]) -> None:
        staging = self._work / "staging" / temp_name(f"{item.model}-{item.version}")
        try:
            try:
                for f in item.files:
                    dest = staging / f.rel
                    ensure_dir(dest.parent)
                    os.link(files[f.target.hashes["sha256"]], dest)
            except OSError as exc:
                kind = DiskFullError if exc.errno in NO_SPACE else InstallError
                raise kind(
                    f"cannot stage {item.model} version {item.version}: {exc.strerror}",
                    model=item.model,
                    version=item.version,
                ) from None
            try:
                done = self._cache.install(item.model, item.version, staging)
            except CacheFullError as exc:
                raise DiskFullError(exc.message, model=item.model, version=item.version) from None
            except CacheError as exc:
                raise InstallError(exc.message, model=item.model, version=item.version) from None
        finally:
            remove_tree(staging)
        if done.digest != item.manifest_digest:
            raise VerificationError(
                f"{item.model} version {item.version}: installed content differs from the signed",
                model=item.model,
                version=item.version,
            )
        logger.info("installed %s version %d sha256:%s", item.model, item.version, done.digest)

    def _check_signature(self, item: SignedVersion, files: Mapping[str, Path]) -> Verdict:
        """The OMS verdict on a downloaded version (its files as python-tuf verified them)."""
        if self._signatures.policy is SignaturePolicy.OFF:
            return Verdict(True)
        bundle = None
        if item.signature is not None:
            path = files[item.signature.target.hashes["sha256"]]
            try:
                bundle = path.read_bytes()
            except OSError as exc:
                raise SyncError(f"cannot read {path}: {exc.strerror}", model=item.model) from None
        digests = {f.rel: f.target.hashes["sha256"] for f in item.files}
        return self._signatures.verdict(item.model, bundle, digests)

    def _refuse(self, item: SignedVersion, verdict: Verdict) -> None:
        """Reject a version whose signature failed under `require` (the active one serves on).

        Reported in `SyncReport.refused`, not as a model error: the rejection is the record,
        and the next plan serves the newest version not rejected.
        """
        reason = f"model signature refused: {verdict.reason}"
        logger.warning("%s version %d: %s", item.model, item.version, reason)
        try:
            self._cache.rejections.reject(item.model, item.version, RejectionCause.FAILED, reason)
        except CacheError as exc:
            raise SyncError(f"cannot reject {item.model} version {item.version}: {exc}") from None

    def _record(self, item: SignedVersion, verdict: Verdict) -> None:
        """Write the version's provenance before installing it."""
        policy = self._signatures.policy
        published = item.files[0].target.custom.get("model_signature") if item.files else None
        record = published if isinstance(published, dict) else {}
        checked = policy is not SignaturePolicy.OFF
        item_record = Provenance(
            item.model,
            item.version,
            signer=verdict.signer if checked and verdict.signer else str(record.get("signer", "")),
            bundle_sha256=(
                verdict.bundle_sha256 if checked else str(record.get("bundle_sha256", ""))
            ),
            verified=checked and verdict.ok,
            policy=policy.value,
            reason=verdict.reason if checked else "not checked on this device (policy off)",
        )
        try:
            self.provenance.record(item_record)
        except (OSError, CacheError) as exc:
            raise SyncError(
                f"cannot record the provenance of {item.model} version {item.version}: {exc}",
                model=item.model,
                version=item.version,
            ) from None


def activate_in_cache(cache: ModelCache, pairs: tuple[tuple[str, int], ...]) -> list[str]:
    """Activate versions directly in a cache no agent is serving (`edge-agent sync --once`).

    Args:
        cache: The cache (the agent must be stopped: it holds the cache while it runs).
        pairs: (model, version) pairs from `SyncReport.activate`.

    Returns:
        One error message per pair that could not be activated.
    """
    failures = []
    for model, version in pairs:
        try:
            cache.activate(model, version)
        except CacheError as exc:
            failures.append(f"{model} version {version}: {exc.message}")
    return failures
