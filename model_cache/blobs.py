"""Content-addressed blob store: each distinct file content is stored once, named by SHA-256.

    blobs/sha256/ab/abcdef…   the bytes whose SHA-256 is `abcdef…`, mode 0444
    blobs/.tmp/.tmp-…         a blob being written, before its digest is known

Storing streams the bytes into a temp file while hashing them, fsyncs it, makes it read-only,
renames it to its digest and fsyncs the shard directory. Version folders hard-link these files,
so versions that share a file share its inode and its bytes.

Invariants:
    * A path `blobs/sha256/xx/<digest>` only ever appears by rename of a complete, fsynced,
      read-only file whose bytes hashed to `<digest>` while being written.
    * Storing content that is already present keeps the existing inode (so existing hard links
      keep sharing it) and discards the new copy.
    * Nothing is kept when a store fails: over the byte cap, a digest mismatch, or ENOSPC.
    * Later tampering is not prevented (root can chmod): `verify` re-hashes, and recovery uses
      it before serving anything.

Example::

    store = BlobStore(CacheLayout(root))
    digest = store.put_file(Path("model.onnx"))
    assert store.verify(digest)
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from model_cache.atomic import (
    READ_ONLY_FILE,
    ensure_dir,
    fsync_dir,
    remove_tree,
    temp_name,
)
from model_cache.errors import BlobTooLargeError, CorruptBlobError, translate_os_error
from model_cache.layout import CacheLayout, validate_digest

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")


def hash_file(path: Path) -> tuple[str, int]:
    """SHA-256 and size of a file, read in chunks.

    Args:
        path: A readable regular file.

    Raises:
        OSError: The file cannot be read.

    Returns:
        (hex digest, size in bytes).
    """
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _read_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


class BlobStore:
    """The `blobs/` part of a cache root.

    Args:
        layout: Paths of the cache root; the blob directories are created if missing.
    """

    def __init__(self, layout: CacheLayout) -> None:
        self._layout = layout
        ensure_dir(layout.blobs_dir)
        ensure_dir(layout.blob_tmp_dir)

    def path_of(self, digest: str) -> Path:
        """Where a blob lives (whether or not it is stored).

        Args:
            digest: SHA-256, 64 lowercase hex digits.

        Raises:
            InvalidVersionError: `digest` is not a valid digest.

        Returns:
            `blobs/sha256/ab/abcdef…`.
        """
        return self._layout.blob_path(digest)

    def has(self, digest: str) -> bool:
        """Whether a blob with this digest is stored (its content is not re-checked).

        Args:
            digest: SHA-256 in hex.

        Returns:
            True when the blob file exists.
        """
        return self.path_of(digest).is_file()

    def size(self, digest: str) -> int:
        """Size in bytes of a stored blob.

        Args:
            digest: SHA-256 in hex.

        Raises:
            FileNotFoundError: The blob is not stored.

        Returns:
            The blob's size.
        """
        return self.path_of(digest).stat().st_size

    def put_file(self, path: Path, *, max_bytes: int | None = None) -> str:
        """Store a file's content.

        Args:
            path: The file to copy in; it is only read.
            max_bytes: Refuse content larger than this.

        Raises:
            BlobTooLargeError: The file is over `max_bytes`.
            CacheFullError: The disk is full.
            CacheError: Any other I/O error.

        Returns:
            The content's SHA-256 digest.
        """
        with translate_os_error(f"read {path}"):
            chunks = _read_chunks(path)
            return self.put_stream(chunks, max_bytes=max_bytes)

    def put_stream(
        self,
        chunks: Iterable[bytes],
        expected_digest: str | None = None,
        max_bytes: int | None = None,
    ) -> str:
        """Store the bytes of a stream (e.g. a download), hashing them on the way.

        Args:
            chunks: The content, in pieces of any size.
            expected_digest: When given, the content must hash to it.
            max_bytes: When given, stop and refuse once more bytes than this arrive.

        Raises:
            CorruptBlobError: The content does not hash to `expected_digest`.
            BlobTooLargeError: More than `max_bytes` bytes arrived.
            CacheFullError: The disk is full.
            CacheError: Any other I/O error.

        Returns:
            The content's SHA-256 digest.
        """
        if expected_digest is not None:
            validate_digest(expected_digest)
        tmp = self._layout.blob_tmp_dir / temp_name("blob")
        with translate_os_error("store blob"):
            try:
                digest = self._write_temp(tmp, chunks, max_bytes)
                if expected_digest is not None and digest != expected_digest:
                    raise CorruptBlobError(
                        f"content hashes to sha256:{digest}, expected sha256:{expected_digest}",
                        digest=expected_digest,
                    )
                self._commit(tmp, digest)
            finally:
                tmp.unlink(missing_ok=True)
        return digest

    def _write_temp(self, tmp: Path, chunks: Iterable[bytes], max_bytes: int | None) -> str:
        digest = hashlib.sha256()
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise BlobTooLargeError(f"content is over the {max_bytes}-byte cap")
                digest.update(chunk)
                handle.write(chunk)
            handle.flush()
            os.fchmod(handle.fileno(), READ_ONLY_FILE)
            os.fsync(handle.fileno())
        return digest.hexdigest()

    def _commit(self, tmp: Path, digest: str) -> None:
        final = self.path_of(digest)
        if final.is_file() and final.stat().st_size == tmp.stat().st_size:
            return  # Deduplicated: keep the existing inode, which versions hard-link.
        ensure_dir(final.parent)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        logger.debug("Stored blob sha256:%s", digest)

    def verify(self, digest: str) -> bool:
        """Re-hash a stored blob.

        Args:
            digest: SHA-256 in hex.

        Returns:
            True when the blob exists and its bytes hash to `digest`; False when it is missing,
            unreadable or altered.
        """
        try:
            actual, _size = hash_file(self.path_of(digest))
        except OSError:
            return False
        if actual != digest:
            logger.warning("Blob sha256:%s hashes to sha256:%s", digest, actual)
        return actual == digest

    def remove(self, digest: str) -> int:
        """Delete a stored blob (hard links elsewhere keep their inode alive).

        Args:
            digest: SHA-256 in hex.

        Raises:
            CacheError: The blob exists but cannot be removed.

        Returns:
            The bytes the blob file held, 0 when it was not stored.
        """
        path = self.path_of(digest)
        with translate_os_error(f"remove blob sha256:{digest}"):
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return 0
            remove_tree(path)
        return size

    def digests(self) -> list[str]:
        """Every stored digest, sorted (files with other names are ignored).

        Returns:
            Digests in hex.
        """
        found: list[str] = []
        if not self._layout.blobs_dir.is_dir():
            return found
        for shard in sorted(self._layout.blobs_dir.iterdir()):
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            found.extend(p.name for p in sorted(shard.iterdir()) if p.name.startswith(shard.name))
        return [d for d in found if _HEX64.fullmatch(d)]

    def total_bytes(self) -> int:
        """Bytes held by stored blobs (each content counted once).

        Returns:
            The sum of the blob files' sizes.
        """
        return sum(self.path_of(d).stat().st_size for d in self.digests())

    def clear_temp(self) -> int:
        """Delete half-written blobs left by a crash. Only safe while nothing is being stored.

        Returns:
            How many temp files were removed.
        """
        removed = 0
        with translate_os_error("clear blob temp files"):
            for entry in sorted(self._layout.blob_tmp_dir.iterdir()):
                removed += remove_tree(entry)
        return removed
