"""The object-storage seam: read and write objects by key, for `file://`, `http(s)://`, `s3://`.

    store = open_store("s3://fleet-models/prod", S3Settings(endpoint_url="http://127.0.0.1:5000"))
    for chunk in store.get("metadata/timestamp.json"):
        ...
    store.put("targets/resnet/2/2/ab12….model.onnx", Path("model.onnx"))

`ObjectStore` is the whole interface: `get(key, offset)` streams an object from a byte offset
(a range request, which is how interrupted downloads resume) and `put(key, path)` writes one.
Everything above this module (the TUF fetcher, the downloader, the publisher) speaks only
`ObjectStore`, so a test can stand a folder, a plain HTTP server or an S3-protocol server behind
it. S3 lives in `sync/s3.py` (boto3, imported only for `s3://`).

Invariants:
    * Keys are relative `/`-separated paths without empty, `.` or `..` segments; anything else is
      refused before any I/O (`check_key`), so a key can never name a file outside the store.
    * `get` yields chunks of at most `CHUNK_BYTES`; memory is bounded by the caller's chunk count,
      never by the object's size. Library errors become `DownloadError` / `NotFoundError`.
    * `put` is atomic where the backend allows it: a folder store writes a temp file, fsyncs it
      and renames it (then fsyncs the folder); S3 objects appear whole or not at all.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import quote

import urllib3

from model_cache.atomic import ensure_dir, fsync_dir, temp_name
from sync.errors import DownloadError, NotFoundError, PublishError

logger = logging.getLogger(__name__)

#: Largest piece a `get` yields (and the read size of every download).
CHUNK_BYTES = 1024 * 1024
_HTTP_READ_BYTES = 64 * 1024
#: Longest key accepted (S3's own limit is 1024 bytes).
MAX_KEY_LENGTH = 1024


class ObjectStore(Protocol):
    """Objects by key: the only I/O interface `sync` has to remote storage."""

    @property
    def url(self) -> str:
        """The store's base URL (for messages and TUF URLs), ending in `/`."""
        ...

    def get(self, key: str, offset: int = 0) -> Iterator[bytes]:
        """Stream an object's bytes from `offset` to its end.

        Args:
            key: Object key (see `check_key`).
            offset: First byte to return; 0 for the whole object.

        Raises:
            NotFoundError: No such object.
            DownloadError: The store is unreachable or the transfer broke off (may be raised
                while iterating, too).

        Returns:
            Chunks of at most `CHUNK_BYTES` (none when `offset` is at or past the end); closing
            the iterator releases the connection.
        """
        ...

    def put(self, key: str, source: Path) -> None:
        """Write a local file as the object `key`, replacing any object there.

        Args:
            key: Object key (see `check_key`).
            source: The file to upload.

        Raises:
            PublishError: The store is read-only or the write failed.
        """
        ...


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3-protocol server; empty values fall back to the AWS environment.

    Credentials always come from boto3's chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
    ~/.aws, instance roles), never from our config file.
    """

    endpoint_url: str = ""  # e.g. http://127.0.0.1:5000 for moto_server or MinIO
    region: str = ""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_attempts: int = 3


def check_key(key: str) -> str:
    """Refuse keys that could leave the store's root or mean different things to backends.

    Args:
        key: A candidate object key.

    Raises:
        DownloadError: Empty, too long, absolute, with a backslash, NUL, or an empty, `.` or
            `..` segment.

    Returns:
        The key, unchanged.
    """
    if not key or len(key) > MAX_KEY_LENGTH or key.startswith("/") or "\\" in key or "\0" in key:
        raise DownloadError(f"invalid object key {key!r}", path=key)
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise DownloadError(f"invalid object key {key!r}", path=key)
    return key


class FileStore:
    """A folder as an object store (`file:///srv/models`); keys are relative paths in it."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root).absolute()

    @property
    def url(self) -> str:
        """`file://ROOT/`."""
        return self._root.as_uri().rstrip("/") + "/"

    def get(self, key: str, offset: int = 0) -> Iterator[bytes]:
        """See `ObjectStore.get`."""
        path = self._root / check_key(key)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}{key}: no such object", path=key) from None
        except OSError as exc:
            raise DownloadError(f"{self.url}{key}: {exc.strerror}", path=key) from None
        return _file_chunks(handle, offset, key)

    def put(self, key: str, source: Path) -> None:
        """See `ObjectStore.put`."""
        path = self._root / check_key(key)
        try:
            ensure_dir(path.parent)
            tmp = path.parent / temp_name(path.name)
            try:
                with source.open("rb") as src, tmp.open("xb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK_BYTES)
                    dst.flush()
                    os.fsync(dst.fileno())
                tmp.chmod(0o644)
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(path.parent)
        except OSError as exc:
            raise PublishError(f"cannot write {path}: {exc.strerror}", path=key) from None


def _file_chunks(handle: BinaryIO, offset: int, key: str) -> Iterator[bytes]:
    with handle:
        try:
            handle.seek(offset)
            while chunk := handle.read(CHUNK_BYTES):
                yield chunk
        except OSError as exc:
            raise DownloadError(f"reading {key}: {exc.strerror}", path=key) from None


class HttpStore:
    """A read-only store over plain HTTP(S) GETs with `Range` (any static web server or CDN)."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self._base = base_url.rstrip("/") + "/"
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(10.0, timeout_s), read=timeout_s),
            retries=urllib3.Retry(total=2, connect=2, read=0, redirect=3, backoff_factor=0.2),
            maxsize=8,
        )

    @property
    def url(self) -> str:
        """The base URL, ending in `/`."""
        return self._base

    def get(self, key: str, offset: int = 0) -> Iterator[bytes]:
        """See `ObjectStore.get`. A server that ignores `Range` is handled by skipping bytes."""
        url = self._base + quote(check_key(key))
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            resp = self._http.request("GET", url, headers=headers, preload_content=False)
        except urllib3.exceptions.HTTPError as exc:
            raise DownloadError(f"{url}: {exc}", path=key) from None
        if resp.status == 416:  # Range starts at or past the end: nothing more to read.
            resp.release_conn()
            return iter(())
        if resp.status in (403, 404):
            resp.release_conn()
            raise NotFoundError(f"{url}: HTTP {resp.status}", path=key)
        if resp.status not in (200, 206):
            resp.release_conn()
            raise DownloadError(f"{url}: HTTP {resp.status}", path=key)
        skip = offset if (offset and resp.status == 200) else 0
        return _http_chunks(resp, skip, url, key)

    def put(self, key: str, source: Path) -> None:
        """HTTP stores are read-only: publish to `s3://` or `file://` and serve that folder."""
        raise PublishError(f"{self._base} is read-only; publish to s3:// or file://", path=key)


def _http_chunks(resp: urllib3.BaseHTTPResponse, skip: int, url: str, key: str) -> Iterator[bytes]:
    try:
        # Small reads: a connection cut mid-read loses at most one read's bytes to resume.
        for chunk in resp.stream(_HTTP_READ_BYTES):
            if skip:
                dropped = min(skip, len(chunk))
                skip -= dropped
                chunk = chunk[dropped:]  # noqa: PLW2901 - trimmed in place on purpose
            if chunk:
                yield chunk
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise DownloadError(f"{url}: transfer broke off: {exc}", path=key) from None
    finally:
        resp.release_conn()
