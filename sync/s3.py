"""`s3://bucket/prefix` as an `ObjectStore`, over boto3.

Why boto3 (and not obstore or a hand-written SigV4 client):
    * Its credential chain *is* "the usual AWS environment variables": AWS_ACCESS_KEY_ID,
      AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/config, container and
      instance roles, with no code of ours handling secrets.
    * Pure Python on top of urllib3: it installs on every Jetson image (aarch64, any JetPack
      Python) without a native wheel, and it is maintained by AWS with a stable API.
    * `endpoint_url` reaches any S3-protocol server (MinIO, Ceph RGW, moto_server in our tests);
      `Range` GETs give resumable downloads; `upload_file` does multipart uploads for publishing.
    The price is import time and ~20 MB of memory, so `open_store` imports this module only for
    `s3://` URLs.

Invariants:
    * Keys are checked by `check_key` and joined under the URL's prefix; nothing outside the
      prefix is read or written.
    * `get` streams `StreamingBody` in `CHUNK_BYTES` pieces and closes it when the iterator is
      closed or fails; every botocore/urllib3 error becomes `DownloadError` / `NotFoundError`.
    * Retries inside one request are botocore's bounded "standard" mode (`max_attempts`); the
      sync loop adds its own exponential backoff across cycles.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import botocore.exceptions
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from sync.errors import DownloadError, NotFoundError, PublishError
from sync.store import CHUNK_BYTES, S3Settings, check_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import GetObjectOutputTypeDef

logger = logging.getLogger(__name__)

_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound", "403", "AccessDenied", "NoSuchBucket"})
_TRANSFER = TransferConfig(multipart_threshold=64 * 1024 * 1024, max_concurrency=4)


class S3Store:
    """Objects under `s3://BUCKET/PREFIX/`.

    Args:
        bucket: Bucket name.
        prefix: Key prefix without leading or trailing `/` ("" for the bucket root).
        settings: Endpoint, region, timeouts and retry bound.
    """

    def __init__(self, bucket: str, prefix: str, settings: S3Settings) -> None:
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        config = Config(
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            retries={"max_attempts": settings.max_attempts, "mode": "standard"},
            # Path-style addressing works with every S3-protocol server on a plain host:port.
            s3={"addressing_style": "path"} if settings.endpoint_url else {},
        )
        session = boto3.session.Session()
        self._client: S3Client = session.client(
            "s3",
            endpoint_url=settings.endpoint_url or None,
            region_name=settings.region or None,
            config=config,
        )

    @property
    def url(self) -> str:
        """`s3://BUCKET/PREFIX/`."""
        return f"s3://{self._bucket}/{self._prefix}"

    def get(self, key: str, offset: int = 0) -> Iterator[bytes]:
        """See `ObjectStore.get`: a GET with `Range: bytes=OFFSET-` when resuming."""
        full = self._prefix + check_key(key)
        try:
            if offset:
                resp = self._client.get_object(
                    Bucket=self._bucket, Key=full, Range=f"bytes={offset}-"
                )
            else:
                resp = self._client.get_object(Bucket=self._bucket, Key=full)
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code == "InvalidRange":  # offset at or past the end: nothing more to read
                return iter(())
            if code in _MISSING_CODES:
                raise NotFoundError(f"{self.url}{key}: no such object ({code})", path=key) from None
            raise DownloadError(f"{self.url}{key}: {code or exc}", path=key) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise DownloadError(f"{self.url}{key}: {exc}", path=key) from None
        return self._chunks(resp, key)

    def _chunks(self, resp: GetObjectOutputTypeDef, key: str) -> Iterator[bytes]:
        body = resp["Body"]
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise DownloadError(f"{self.url}{key}: transfer broke off: {exc}", path=key) from None
        finally:
            body.close()

    def put(self, key: str, source: Path) -> None:
        """See `ObjectStore.put` (multipart above 64 MiB; the object appears whole)."""
        full = self._prefix + check_key(key)
        try:
            self._client.upload_file(str(source), self._bucket, full, Config=_TRANSFER)
        except (S3UploadFailedError, botocore.exceptions.BotoCoreError) as exc:
            raise PublishError(f"cannot upload {self.url}{key}: {exc}", path=key) from None
        except botocore.exceptions.ClientError as exc:
            raise PublishError(f"cannot upload {self.url}{key}: {exc}", path=key) from None
        except OSError as exc:
            raise PublishError(f"cannot read {source}: {exc.strerror}", path=key) from None

    def ensure_bucket(self) -> bool:
        """Create the bucket if it does not exist (for a fresh local S3 server).

        Raises:
            PublishError: The bucket cannot be checked or created.

        Returns:
            True when the bucket was created.
        """
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except botocore.exceptions.ClientError:
            pass
        except botocore.exceptions.BotoCoreError as exc:
            raise PublishError(f"cannot reach s3://{self._bucket}: {exc}") from None
        else:
            return False
        try:
            self._client.create_bucket(Bucket=self._bucket)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise PublishError(f"cannot create bucket {self._bucket}: {exc}") from None
        logger.info("created bucket %s", self._bucket)
        return True
