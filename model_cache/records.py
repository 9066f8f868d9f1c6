"""Typed values the cache hands out: version states, rows, events, installed versions.

Pure data, no I/O. The version state machine lives here so that `state.py` (which enforces it
in the database) and `versions.py` (which explains refusals to callers) read the same table::

    staged  → ready | failed            (install commits, or is found broken)
    ready   → active | failed           (activate; verification failure)
    active  → retired | failed          (another version activated / deactivate; corruption)
    retired → active | failed           (rollback; corruption)
    failed  → staged                    (only by re-installing, which replaces the row)

A version can also be *rejected* on this device (`RejectedVersion`): it failed to load or warm
up here, or an operator rolled back from it. That is not a state of the row above (a rejected
version may be retired, ready, or already evicted): it is a separate fact, kept until an
operator clears it, that tells the sync never to activate that version by itself.

Invariants:
    * Records are frozen: a record is a snapshot of the database at one instant, never a live
      view; ask the cache again for fresh state.
    * `InstalledVersion.path` is a one-version Triton model folder (`config.pbtxt`, `VERSION/`),
      whether or not the version is currently served.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from model_cache.layout import CONFIG_NAME


class VersionState(str, Enum):
    """Where a version is in its life."""

    STAGED = "staged"
    READY = "ready"
    ACTIVE = "active"
    RETIRED = "retired"
    FAILED = "failed"


class RejectionCause(str, Enum):
    """Why a version is rejected on this device."""

    FAILED = "failed"  # it failed to load or warm up here
    ROLLED_BACK = "rolled-back"  # an operator rolled back from it


#: The moves `StateDB.set_state` allows; activation (ready/retired → active) has its own method.
ALLOWED_MOVES: Mapping[VersionState, frozenset[VersionState]] = {
    VersionState.STAGED: frozenset({VersionState.READY, VersionState.FAILED}),
    VersionState.READY: frozenset({VersionState.FAILED}),
    VersionState.ACTIVE: frozenset({VersionState.RETIRED, VersionState.FAILED}),
    VersionState.RETIRED: frozenset({VersionState.FAILED}),
    VersionState.FAILED: frozenset(),
}

#: States from which a version may be activated.
ACTIVATABLE = frozenset({VersionState.READY, VersionState.RETIRED, VersionState.ACTIVE})

#: States whose folder must be complete and verified to be trusted.
COMMITTED = frozenset({VersionState.READY, VersionState.ACTIVE, VersionState.RETIRED})


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """One row of the `versions` table.

    Attributes:
        model: Model name.
        version: Version number.
        digest: SHA-256 of the version's manifest.
        state: Current state.
        reason: Why it is failed (or other note), else None.
        created_at: When it was first staged (epoch seconds, injected clock).
        activated_at: When it last became active, or None if never.
        last_used: When it was last served or installed; GC evicts the oldest first.
    """

    model: str
    version: int
    digest: str
    state: VersionState
    reason: str | None
    created_at: float
    activated_at: float | None
    last_used: float


@dataclass(frozen=True, slots=True)
class RejectedVersion:
    """A version this device will not activate by itself until an operator clears it.

    Attributes:
        model: Model name.
        version: Version number.
        cause: Failed here, or rolled back from by an operator.
        reason: The load error, or which rollback.
        digest: The content rejected (its manifest digest), when the cache held it.
        rejected_at: When (epoch seconds, injected clock).
    """

    model: str
    version: int
    cause: RejectionCause
    reason: str
    digest: str | None
    rejected_at: float

    def to_json(self) -> dict[str, Any]:
        """The fields as plain JSON values (for the HTTP API, status and telemetry)."""
        return {
            "model": self.model,
            "version": self.version,
            "cause": self.cause.value,
            "reason": self.reason,
            "rejected_at": self.rejected_at,
        }


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file of a version: path inside the version folder, blob digest, size in bytes."""

    path: str
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One entry of the event log.

    Attributes:
        id: Increasing id; pass the last one seen to `ModelCache.events` to get newer ones.
        time: Epoch seconds (injected clock).
        model: Model concerned, if any.
        version: Version concerned, if any.
        kind: E.g. staged, ready, activated, retired, rolled-back, failed, evicted, recovered.
        detail: JSON fields: digest, reason, previous version, ...
    """

    id: int
    time: float
    model: str | None
    version: int | None
    kind: str
    detail: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class InstalledVersion:
    """A version the cache holds, as `install`, `activate` and `list_versions` report it.

    Attributes:
        model: Model name.
        version: Version number.
        digest: SHA-256 of the version's manifest (its content identity).
        state: State at the time of the call.
        reason: Why it failed, when it did.
        path: `versions/MODEL/VERSION-DIGEST12`, a one-version Triton model folder.
        created_at: When it was staged.
        activated_at: When it last became active, or None.
        last_used: When it was last served or installed.
    """

    model: str
    version: int
    digest: str
    state: VersionState
    reason: str | None
    path: Path
    created_at: float
    activated_at: float | None
    last_used: float

    @property
    def version_dir(self) -> Path:
        """The Triton version folder (`path/VERSION`), e.g. to load before activation."""
        return self.path / str(self.version)

    @property
    def config_path(self) -> Path:
        """This version's `config.pbtxt`."""
        return self.path / CONFIG_NAME

    @classmethod
    def from_record(cls, record: VersionRecord, path: Path) -> InstalledVersion:
        """Combine a database row with its folder.

        Args:
            record: The row.
            path: The version folder.

        Returns:
            The installed version.
        """
        return cls(
            model=record.model,
            version=record.version,
            digest=record.digest,
            state=record.state,
            reason=record.reason,
            path=path,
            created_at=record.created_at,
            activated_at=record.activated_at,
            last_used=record.last_used,
        )
