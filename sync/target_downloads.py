"""Step 3 of a sync cycle: download every distinct target file a plan needs, and verify it.

Each file is streamed into `WORK/downloads/SHA256.part` by the `Downloader` (capped at its
signed length, resumed with range requests), a few at a time, then python-tuf's
`TargetFile.verify_length_and_hashes` accepts it (renamed to `WORK/downloads/SHA256`) or
refuses it (removed).

Invariants:
    * A file shared by several versions is downloaded once (keyed by its signed sha256).
    * A failure fails that file only: it is recorded against the model that needed it, and the
      versions needing it are not installed; the other downloads go on.
    * Only part files survive a failure, to be resumed; a refused file is removed. A resumed
      file that fails verification is downloaded again from its first byte before it is
      refused: what a power cut left of a part file is not trusted.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import TargetFile

from model_cache.atomic import ensure_dir
from sync.errors import DiskFullError, DownloadError, SyncError, TargetError, VerificationError
from sync.fetcher import Downloader
from sync.policy import SignedVersion
from sync.publish import TARGETS_PREFIX

__all__ = ["NO_SPACE", "DownloadTally", "Progress", "TargetDownloads"]

logger = logging.getLogger(__name__)

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})  # errnos that mean the disk is full


@dataclass(frozen=True, slots=True)
class Progress:
    """Bytes of target files downloaded so far in this cycle, out of those needed."""

    done_bytes: int
    total_bytes: int


@dataclass(slots=True)
class DownloadTally:
    """What one cycle's downloads came to (updated from the download threads)."""

    total: int
    report: Callable[[Progress], None]
    done: int = 0
    resumed: int = 0
    transient: bool = False  # a download failed in transport: worth retrying sooner
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, count: int) -> None:
        """Count `count` more bytes downloaded and report the progress."""
        with self.lock:
            self.done += count
            done = self.done
        self.report(Progress(done, self.total))


class TargetDownloads:
    """Downloads and verifies target files into `work_dir/downloads`.

    Args:
        downloader: Streams target files from the store (injected to simulate faults).
        work_dir: The sync's work folder (e.g. `CACHE/sync`).
        max_parallel: Target files downloaded at once.
        progress: Called with byte counts while downloading (from worker threads).
    """

    def __init__(
        self,
        downloader: Downloader,
        work_dir: Path,
        *,
        max_parallel: int,
        progress: Callable[[Progress], None],
    ) -> None:
        self._downloader = downloader
        self._dir = work_dir / "downloads"
        self._parallel = max(1, max_parallel)
        self._progress = progress

    def fetch(
        self, versions: list[SignedVersion], errors: list[tuple[str, str]], *, consistent: bool
    ) -> tuple[dict[str, Path], DownloadTally]:
        """Download and verify every distinct file of `versions`.

        Args:
            versions: The versions to fetch.
            errors: Gets one (model, reason) per file that failed.
            consistent: The verified root's `consistent_snapshot` (targets are then stored
                under hash-prefixed names).

        Raises:
            SyncError: The downloads folder cannot be created.

        Returns:
            sha256 → verified file, and the cycle's tally.
        """
        unique: dict[str, tuple[TargetFile, str]] = {}
        for item in versions:
            for f in item.downloads:
                unique.setdefault(f.target.hashes["sha256"], (f.target, item.model))
        tally = DownloadTally(sum(t.length for t, _m in unique.values()), self._progress)
        if not unique:
            return {}, tally
        try:
            ensure_dir(self._dir)
        except OSError as exc:
            raise SyncError(f"cannot create {self._dir}: {exc.strerror}") from None
        done: dict[str, Path] = {}
        with ThreadPoolExecutor(self._parallel, thread_name_prefix="sync-download") as pool:
            futures = {
                sha: pool.submit(self._fetch_one, info, tally, consistent)
                for sha, (info, _m) in unique.items()
            }
            for sha, future in futures.items():
                try:
                    done[sha] = future.result()
                except SyncError as exc:
                    tally.transient |= isinstance(exc, DownloadError)
                    model = unique[sha][1]
                    logger.debug("download of %s failed: %s", unique[sha][0].path, exc.message)
                    errors.append((model, exc.message))
        return done, tally

    def _fetch_one(self, info: TargetFile, tally: DownloadTally, consistent: bool) -> Path:
        sha = info.hashes["sha256"]
        final = self._dir / sha
        part = self._dir / f"{sha}.part"
        key = TARGETS_PREFIX + (info.get_prefixed_paths()[0] if consistent else info.path)
        try:
            if final.exists():
                os.replace(final, part)  # re-verified below like any other download
            resumed = self._downloader.download(key, part, info.length, tally.add)
            with tally.lock:
                tally.resumed += resumed
            if resumed and not _verifies(info, part):
                # A part file is never fsynced: after a power cut its bytes may be a torn
                # prefix (blocks of zeros or stale data), so a resumed download that fails is
                # fetched again whole, once, before it counts as refused.
                logger.info("resumed download of %s does not verify: fetching it whole", key)
                part.unlink()
                self._downloader.download(key, part, info.length, tally.add)
            with part.open("rb") as handle:
                info.verify_length_and_hashes(handle)  # python-tuf decides
            os.replace(part, final)
        except tuf_exceptions.LengthOrHashMismatchError as exc:
            part.unlink(missing_ok=True)
            raise TargetError(f"{info.path}: refused: {exc}", path=info.path) from None
        except VerificationError:
            part.unlink(missing_ok=True)
            raise
        except OSError as exc:
            if exc.errno in NO_SPACE:
                part.unlink(missing_ok=True)
                raise DiskFullError(
                    f"no space left for {info.path} in {self._dir}", path=info.path
                ) from None
            raise SyncError(f"cannot write {part}: {exc}", path=info.path) from None
        return final


def _verifies(info: TargetFile, path: Path) -> bool:
    with path.open("rb") as handle:
        try:
            info.verify_length_and_hashes(handle)
        except tuf_exceptions.LengthOrHashMismatchError:
            return False
    return True
