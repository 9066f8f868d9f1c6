"""Signed model versions from object storage: publisher, device sync, periodic loop.

python-tuf makes every trust decision (signatures, thresholds, expiry, rollback, target hashes);
this package adds transport, our own rules about what a model version is, and orchestration.

    store.py      the `ObjectStore` seam: file://, http(s):// (and s3.py: s3:// over boto3)
    fetcher.py    python-tuf `FetcherInterface` over a store; resumable, capped target downloads
    keys.py       key files (0600), root metadata, key rotation and thresholds
    publish.py    `Publisher`: add a model version to the signed repository
    policy.py     pure rules: valid signed versions, desired state, what to fetch and serve
    model_signature.py  pure OMS check: a model's signature bundle against its files and keys
    provenance.py  per installed version: who signed it, verified or not (for status, events)
    client.py     `SyncClient.sync_once`: refresh → download → verify → OMS check → cache.install
    target_downloads.py  a cycle's target files: parallel, resumed, verified by python-tuf
    periodic.py   the daemon's loop: interval with jitter, exponential backoff
    config.py     `SyncConfig` (the agent's `[sync]` section)
    cli.py        `edge-agent keys init|rotate`, `publish`, `sync --once`
    errors.py     `SyncError` tree
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sync.client import SyncClient, SyncReport, activate_in_cache
    from sync.errors import (
        DiskFullError,
        DownloadError,
        InstallError,
        KeyFileError,
        MetadataError,
        NotFoundError,
        PublishError,
        SyncConfigError,
        SyncError,
        TargetError,
        UnsafeTargetError,
        VerificationError,
    )
    from sync.keys import Expiry, RoleSpec, init_keys, rotate_keys
    from sync.policy import Desired, Kind, parse_desired
    from sync.publish import Publisher, PublishReport
    from sync.store import ObjectStore, S3Settings
    from sync.stores import open_store
    from sync.target_downloads import Progress

# Imported on first use: the agent reads `sync.config` at every start, but boto3 and python-tuf
# (about 26 MiB of RSS) are only needed when a [sync] section is configured.
_HOME = {
    "Desired": "sync.policy",
    "DiskFullError": "sync.errors",
    "DownloadError": "sync.errors",
    "Expiry": "sync.keys",
    "InstallError": "sync.errors",
    "KeyFileError": "sync.errors",
    "Kind": "sync.policy",
    "MetadataError": "sync.errors",
    "NotFoundError": "sync.errors",
    "ObjectStore": "sync.store",
    "Progress": "sync.target_downloads",
    "PublishError": "sync.errors",
    "PublishReport": "sync.publish",
    "Publisher": "sync.publish",
    "RoleSpec": "sync.keys",
    "S3Settings": "sync.store",
    "SyncClient": "sync.client",
    "SyncConfigError": "sync.errors",
    "SyncError": "sync.errors",
    "SyncReport": "sync.client",
    "TargetError": "sync.errors",
    "UnsafeTargetError": "sync.errors",
    "VerificationError": "sync.errors",
    "activate_in_cache": "sync.client",
    "init_keys": "sync.keys",
    "open_store": "sync.stores",
    "parse_desired": "sync.policy",
    "rotate_keys": "sync.keys",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'sync' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DiskFullError",
    "DownloadError",
    "Desired",
    "Expiry",
    "InstallError",
    "KeyFileError",
    "Kind",
    "MetadataError",
    "NotFoundError",
    "ObjectStore",
    "Progress",
    "PublishError",
    "PublishReport",
    "Publisher",
    "RoleSpec",
    "S3Settings",
    "SyncClient",
    "SyncConfigError",
    "SyncError",
    "SyncReport",
    "TargetError",
    "UnsafeTargetError",
    "VerificationError",
    "activate_in_cache",
    "init_keys",
    "open_store",
    "parse_desired",
    "rotate_keys",
]
