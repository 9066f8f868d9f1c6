"""`open_store(url)`: the object store a URL names (see `sync.store` for the interface).

Kept apart from `sync.store` because the S3 store builds on that module: the factory sits above
both, and imports `sync.s3` (boto3) only when a URL asks for S3.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from sync.config import need_extra
from sync.errors import SyncConfigError
from sync.store import FileStore, HttpStore, ObjectStore, S3Settings


def open_store(url: str, s3: S3Settings | None = None) -> ObjectStore:
    """Build the store a URL names.

    Args:
        url: `file:///abs/folder`, `http(s)://host/prefix` or `s3://bucket[/prefix]`.
        s3: Endpoint, region and timeouts for `s3://` (defaults: the AWS environment).

    Raises:
        SyncConfigError: An unknown scheme or a malformed URL.

    Returns:
        The store.
    """
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise SyncConfigError(f"file URL must be file:///absolute/path, got {url!r}")
        return FileStore(Path(unquote(parsed.path)))
    if parsed.scheme in ("http", "https"):
        if not parsed.netloc:
            raise SyncConfigError(f"HTTP URL without a host: {url!r}")
        return HttpStore(url)
    if parsed.scheme == "s3":
        # boto3 is heavy (the s3 extra): imported only for s3://, so the other stores never load it.
        need_extra("boto3", "s3", f"the store {url}")
        from sync.s3 import S3Store  # noqa: PLC0415

        if not parsed.netloc:
            raise SyncConfigError(f"S3 URL without a bucket: {url!r}")
        return S3Store(parsed.netloc, parsed.path.strip("/"), s3 or S3Settings())
    raise SyncConfigError(f"unsupported store URL {url!r} (use s3://, https://, http://, file://)")
