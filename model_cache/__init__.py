"""Content-addressed model cache with atomic activation, recovery and garbage collection.

`ModelCache` is the facade: `install` a version from a Triton model folder, `activate` or
`rollback` it, serve `repository_path` (a Triton repository whose content changes by one atomic
rename), and `gc.collect` old versions under a disk budget. Module map:

    layout.py      pure path rules and name validation
    atomic.py      durable writes: temp file, fsync, os.replace, fsync dir
    blobs.py       content-addressed blob store
    manifest.py    version manifests; what a source folder must contain
    records.py     typed records and the version state machine
    schema.py      the state database's schema and migrations
    state.py       SQLite state (sqlite-utils, WAL): versions, files, events, rejections
    rejections.py  versions rejected on this device (failed here, or rolled back from)
    verify.py      checking a version folder against its manifest
    install.py     install / uninstall steps
    view.py        served view generations and the repository symlink
    activation.py  activate / rollback / deactivate steps
    recovery.py    start-up recovery rules
    versions.py    `ModelCache`
    gc.py          retention and disk-budget collection
    errors.py      `CacheError` tree
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model_cache.activation import ACTIVATE_STEPS
    from model_cache.blobs import BlobStore
    from model_cache.errors import (
        BlobTooLargeError,
        CacheError,
        CacheFullError,
        CorruptBlobError,
        InvalidVersionError,
        VersionNotFoundError,
    )
    from model_cache.gc import GcReport, budget_order, collect, plan_retention
    from model_cache.install import INSTALL_STEPS, FaultHook
    from model_cache.layout import CacheLayout
    from model_cache.records import (
        CacheEvent,
        InstalledVersion,
        RejectedVersion,
        RejectionCause,
        VersionRecord,
        VersionState,
    )
    from model_cache.recovery import RecoveryReport
    from model_cache.rejections import Rejections
    from model_cache.state import StateDB
    from model_cache.versions import ModelCache

# Imported on first use: the agent reads `model_cache.layout` (and `CacheError`) at every start,
# but the SQLite state and the steps behind `ModelCache` only when a cache.dir is configured.
_HOME = {
    "ACTIVATE_STEPS": "model_cache.activation",
    "BlobStore": "model_cache.blobs",
    "BlobTooLargeError": "model_cache.errors",
    "CacheError": "model_cache.errors",
    "CacheEvent": "model_cache.records",
    "CacheFullError": "model_cache.errors",
    "CacheLayout": "model_cache.layout",
    "CorruptBlobError": "model_cache.errors",
    "FaultHook": "model_cache.install",
    "GcReport": "model_cache.gc",
    "INSTALL_STEPS": "model_cache.install",
    "InstalledVersion": "model_cache.records",
    "InvalidVersionError": "model_cache.errors",
    "ModelCache": "model_cache.versions",
    "RecoveryReport": "model_cache.recovery",
    "RejectedVersion": "model_cache.records",
    "RejectionCause": "model_cache.records",
    "Rejections": "model_cache.rejections",
    "StateDB": "model_cache.state",
    "VersionNotFoundError": "model_cache.errors",
    "VersionRecord": "model_cache.records",
    "VersionState": "model_cache.records",
    "budget_order": "model_cache.gc",
    "collect": "model_cache.gc",
    "plan_retention": "model_cache.gc",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'model_cache' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ACTIVATE_STEPS",
    "INSTALL_STEPS",
    "BlobStore",
    "BlobTooLargeError",
    "CacheError",
    "CacheEvent",
    "CacheFullError",
    "CacheLayout",
    "CorruptBlobError",
    "FaultHook",
    "GcReport",
    "InstalledVersion",
    "InvalidVersionError",
    "ModelCache",
    "RecoveryReport",
    "RejectedVersion",
    "Rejections",
    "RejectionCause",
    "StateDB",
    "VersionNotFoundError",
    "VersionRecord",
    "VersionState",
    "budget_order",
    "collect",
    "plan_retention",
]
