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
