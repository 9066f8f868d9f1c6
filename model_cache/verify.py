"""Checking an installed version folder against its manifest and the blob store.

A version is trusted only if all of these hold:

    1. `versions/MODEL/V-D12/manifest.json` hashes to the digest the database recorded;
    2. the manifest names this model and version and is well formed;
    3. the folder holds exactly the manifest's files and directories (no symlinks, nothing extra,
       nothing missing), each file with the recorded size;
    4. (deep check) each file's bytes hash to its recorded digest.

Files are hard links to blobs, so the deep check hashes each blob once and reuses the answer
for every version that shares the inode (`blob_results`); a file that is no longer linked to its
blob is hashed on its own. A file whose blob went missing but whose bytes are intact is linked
back into the store, so shared content stays counted once.

Invariants:
    * Verification never modifies a version folder; the only write is re-linking a missing blob.
    * A corrupt blob is reported in `VerifyResult.corrupt_blobs` so the caller can delete it:
      otherwise a later install of the same content would deduplicate onto the bad bytes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from model_cache.atomic import ensure_dir, fsync_dir
from model_cache.blobs import BlobStore, hash_file
from model_cache.errors import InvalidVersionError
from model_cache.layout import MANIFEST_NAME, CacheLayout
from model_cache.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestEntry


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of checking one version.

    Attributes:
        reason: Why the version cannot be trusted, or None when it can.
        corrupt_blobs: Digests of stored blobs whose bytes no longer match their name.
    """

    reason: str | None
    corrupt_blobs: frozenset[str] = frozenset()

    @property
    def ok(self) -> bool:
        """True when the version can be served."""
        return self.reason is None


def verify_version(
    layout: CacheLayout,
    blobs: BlobStore,
    model: str,
    version: int,
    digest: str,
    *,
    deep: bool = True,
    blob_results: dict[str, bool] | None = None,
) -> VerifyResult:
    """Check one installed version (see the module docstring for the rules).

    Args:
        layout: Paths of the cache root.
        blobs: The blob store the version's files link to.
        model: Model name.
        version: Version number.
        digest: The manifest digest the database recorded.
        deep: Re-hash file contents (False checks structure and sizes only).
        blob_results: Cache of blob digest → verified, shared across calls.

    Returns:
        The result; never raises for a broken version (I/O errors become the reason).
    """
    unit = layout.version_dir(model, version, digest)
    try:
        manifest = _load_manifest(unit, model, version, digest)
    except InvalidVersionError as exc:
        return VerifyResult(exc.message)
    except OSError as exc:
        return VerifyResult(f"manifest unreadable: {exc.strerror}")
    try:
        reason = _check_tree(unit, manifest)
    except OSError as exc:
        return VerifyResult(f"folder unreadable: {exc.strerror}")
    if reason is not None or not deep:
        return VerifyResult(reason)
    results = blob_results if blob_results is not None else {}
    bad: list[str] = []
    corrupt: set[str] = set()
    for entry in manifest.files:
        try:
            ok = _check_content(unit / entry.path, entry, blobs, results, corrupt)
        except OSError as exc:
            return VerifyResult(f"{entry.path}: unreadable: {exc.strerror}", frozenset(corrupt))
        if not ok:
            bad.append(entry.path)
    if bad:
        reason = f"content does not match its digest: {', '.join(bad)}"
    return VerifyResult(reason, frozenset(corrupt))


def _load_manifest(unit: Path, model: str, version: int, digest: str) -> Manifest:
    if not unit.is_dir() or unit.is_symlink():
        raise InvalidVersionError("version folder missing")
    path = unit / MANIFEST_NAME
    if not stat.S_ISREG(os.lstat(path).st_mode) or path.stat().st_size > MAX_MANIFEST_BYTES:
        raise InvalidVersionError("manifest is not a regular file of sane size")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise InvalidVersionError("manifest does not match the recorded digest")
    manifest = Manifest.from_bytes(data)
    if (manifest.model, manifest.version) != (model, version):
        raise InvalidVersionError(
            f"manifest is for {manifest.model} version {manifest.version}, "
            f"not {model} version {version}"
        )
    return manifest


def _check_tree(unit: Path, manifest: Manifest) -> str | None:
    files: dict[str, int] = {}
    dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(unit):
        base = Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            rel = path.relative_to(unit).as_posix()
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                dirs.add(rel)
            elif stat.S_ISREG(info.st_mode):
                files[rel] = info.st_size
            else:
                return f"unexpected entry {rel} (not a file or directory)"
    files.pop(MANIFEST_NAME, None)
    expected = {e.path: e.size for e in manifest.files}
    missing = sorted((set(expected) - set(files)) | (set(manifest.dirs) - dirs))
    extra = sorted((set(files) - set(expected)) | (dirs - set(manifest.dirs)))
    if missing or extra:
        return f"folder differs from manifest: missing {missing}, extra {extra}"
    wrong = sorted(p for p, size in expected.items() if files[p] != size)
    if wrong:
        return f"size differs from manifest: {', '.join(wrong)}"
    return None


def _check_content(
    path: Path,
    entry: ManifestEntry,
    blobs: BlobStore,
    results: dict[str, bool],
    corrupt: set[str],
) -> bool:
    info = os.lstat(path)
    blob = blobs.path_of(entry.digest)
    try:
        blob_info: os.stat_result | None = os.lstat(blob)
    except FileNotFoundError:
        blob_info = None
    if blob_info is not None and (blob_info.st_ino, blob_info.st_dev) == (
        info.st_ino,
        info.st_dev,
    ):
        if entry.digest not in results:
            results[entry.digest] = blobs.verify(entry.digest)
        if not results[entry.digest]:
            corrupt.add(entry.digest)
        return results[entry.digest]
    actual, _size = hash_file(path)
    if actual != entry.digest:
        return False
    if blob_info is None:
        ensure_dir(blob.parent)
        os.link(path, blob)
        fsync_dir(blob.parent)
    return True
