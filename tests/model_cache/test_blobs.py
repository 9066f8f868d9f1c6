"""The content-addressed blob store: hashing, dedup, read-only files, caps, verification."""

from __future__ import annotations

import errno
import hashlib
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_cache import (
    BlobStore,
    BlobTooLargeError,
    CacheError,
    CacheFullError,
    CacheLayout,
    CorruptBlobError,
)
from model_cache.blobs import hash_file
from tests.model_cache.support import tamper


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(CacheLayout(tmp_path / "cache"))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_put_file_stores_content_under_its_digest(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"hello"))

    assert digest == sha(b"hello")
    assert store.has(digest)
    assert store.path_of(digest).read_bytes() == b"hello"
    assert store.size(digest) == 5
    assert store.digests() == [digest]


def test_stored_blobs_are_read_only(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"hello"))

    mode = stat.S_IMODE(store.path_of(digest).stat().st_mode)
    assert mode == 0o444


def test_same_content_is_stored_once_and_keeps_its_inode(store: BlobStore, tmp_path: Path) -> None:
    first = store.put_file(write(tmp_path, "a", b"same"))
    inode = store.path_of(first).stat().st_ino

    second = store.put_file(write(tmp_path, "b", b"same"))

    assert second == first
    assert store.path_of(second).stat().st_ino == inode
    assert store.digests() == [first]
    assert store.total_bytes() == 4


def test_different_content_gets_different_blobs(store: BlobStore, tmp_path: Path) -> None:
    a = store.put_file(write(tmp_path, "a", b"one"))
    b = store.put_file(write(tmp_path, "b", b"two"))

    assert a != b
    assert store.digests() == sorted([a, b])
    assert store.total_bytes() == 6


def test_put_stream_hashes_chunks(store: BlobStore) -> None:
    digest = store.put_stream(iter([b"he", b"", b"llo"]), expected_digest=sha(b"hello"))

    assert digest == sha(b"hello")
    assert store.path_of(digest).read_bytes() == b"hello"


def test_put_stream_refuses_a_digest_mismatch_and_keeps_nothing(
    store: BlobStore, tmp_path: Path
) -> None:
    with pytest.raises(CorruptBlobError) as caught:
        store.put_stream([b"evil"], expected_digest=sha(b"good"))

    assert caught.value.digest == sha(b"good")
    assert store.digests() == []
    assert list((tmp_path / "cache" / "blobs" / ".tmp").iterdir()) == []


def test_put_stream_stops_at_the_byte_cap_and_keeps_nothing(
    store: BlobStore, tmp_path: Path
) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * 1000

    with pytest.raises(BlobTooLargeError):
        store.put_stream(endless(), max_bytes=10_000)

    assert store.digests() == []
    assert list((tmp_path / "cache" / "blobs" / ".tmp").iterdir()) == []


def test_put_file_respects_the_cap(store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(BlobTooLargeError):
        store.put_file(write(tmp_path, "big", b"x" * 11), max_bytes=10)
    assert store.put_file(write(tmp_path, "ok", b"x" * 10), max_bytes=10) == sha(b"x" * 10)


def test_disk_full_becomes_cache_full_error(store: BlobStore, tmp_path: Path) -> None:
    def failing() -> Iterator[bytes]:
        yield b"partial"
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CacheFullError):
        store.put_stream(failing())

    assert store.digests() == []
    assert list((tmp_path / "cache" / "blobs" / ".tmp").iterdir()) == []


def test_unreadable_source_becomes_cache_error(store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(CacheError):
        store.put_file(tmp_path / "missing")


def test_verify_detects_tampering(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"original"))
    assert store.verify(digest)

    tamper(store.path_of(digest), b"modified")

    assert not store.verify(digest)


def test_verify_of_a_missing_blob_is_false(store: BlobStore) -> None:
    assert not store.verify(sha(b"never stored"))


def test_a_blob_with_the_wrong_size_is_replaced_on_put(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"original"))
    tamper(store.path_of(digest), b"short")

    assert store.put_file(write(tmp_path, "b", b"original")) == digest
    assert store.verify(digest)


def test_remove_deletes_and_reports_bytes(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"12345"))

    assert store.remove(digest) == 5
    assert not store.has(digest)
    assert store.remove(digest) == 0


def test_hard_links_survive_removal(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"shared"))
    link = tmp_path / "link"
    link.hardlink_to(store.path_of(digest))

    store.remove(digest)

    assert link.read_bytes() == b"shared"


def test_clear_temp_removes_half_written_blobs(store: BlobStore, tmp_path: Path) -> None:
    tmp_dir = tmp_path / "cache" / "blobs" / ".tmp"
    (tmp_dir / ".tmp-blob-dead").write_bytes(b"half")

    assert store.clear_temp() == 1
    assert list(tmp_dir.iterdir()) == []


def test_digests_ignore_foreign_files(store: BlobStore, tmp_path: Path) -> None:
    digest = store.put_file(write(tmp_path, "a", b"x"))
    (store.path_of(digest).parent / "notes.txt").write_text("hi")

    assert store.digests() == [digest]


def test_hash_file_matches_hashlib(tmp_path: Path) -> None:
    data = bytes(range(256)) * 10_000
    assert hash_file(write(tmp_path, "a", data)) == (sha(data), len(data))
