"""The ObjectStore implementations against a folder, a plain HTTP server and moto's S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from sync.errors import DownloadError, NotFoundError, PublishError, SyncConfigError
from sync.s3 import S3Store
from sync.store import FileStore, HttpStore, ObjectStore, S3Settings, check_key
from sync.stores import open_store
from tests.support import free_port


def _roundtrip(store: ObjectStore, tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"0123456789" * 1000)
    store.put("a/b/obj.bin", tmp_path / "src")
    assert b"".join(store.get("a/b/obj.bin")) == b"0123456789" * 1000
    assert b"".join(store.get("a/b/obj.bin", 9995)) == b"56789"
    assert b"".join(store.get("a/b/obj.bin", 10_000)) == b""
    with pytest.raises(NotFoundError):
        b"".join(store.get("a/b/missing"))


def test_file_store(tmp_path: Path) -> None:
    _roundtrip(FileStore(tmp_path / "bucket"), tmp_path)


def test_s3_store(s3_store: S3Store, tmp_path: Path) -> None:
    _roundtrip(s3_store, tmp_path)
    assert s3_store.url.endswith("/fleet/prod/")


def test_http_store_reads_what_a_folder_store_wrote(http_url: str, tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"0123456789" * 1000)
    FileStore(tmp_path / "bucket").put("a/b/obj.bin", tmp_path / "src")
    store = HttpStore(http_url)
    assert b"".join(store.get("a/b/obj.bin", 9995)) == b"56789"
    assert b"".join(store.get("a/b/obj.bin", 10_000)) == b""
    with pytest.raises(NotFoundError):
        store.get("a/b/missing")
    with pytest.raises(PublishError, match="read-only"):
        store.put("x", tmp_path / "src")


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a\\b", "a\0b"])
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(DownloadError, match="invalid object key"):
        check_key(key)


def test_unreachable_stores_raise_download_errors() -> None:
    port = free_port()
    with pytest.raises(DownloadError):
        HttpStore(f"http://127.0.0.1:{port}/").get("x")
    s3 = S3Store("b", "", S3Settings(f"http://127.0.0.1:{port}", "us-east-1", max_attempts=1))
    with pytest.raises(DownloadError):
        s3.get("x")


def test_open_store_schemes(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path.as_uri()), FileStore)
    assert isinstance(open_store("https://example.invalid/repo"), HttpStore)
    assert isinstance(open_store("s3://bucket/p", S3Settings("http://127.0.0.1:1")), S3Store)
    for bad in ("ftp://x/y", "file://host/x", "s3:///nobucket", "relative/path"):
        with pytest.raises(SyncConfigError):
            open_store(bad)
