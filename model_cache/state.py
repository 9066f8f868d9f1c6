"""The cache's state database: models, versions and their states, files, and an event log.

SQLite through `sqlite-utils`, in WAL mode with `synchronous=FULL` (a commit is on disk when the
call returns; NORMAL could lose the last commits at a power cut). Tables::

    models    name PK, created_at
    versions  (model, version) PK, digest (of the manifest), state, reason,
              created_at, activated_at, last_used
    files     (model, version, path) PK → versions, digest, size     (blob references for GC)
    events    id AUTOINCREMENT, time, model, version, kind, detail (JSON)
    rejected  (model, version) PK, cause, reason, digest, rejected_at  (outlives eviction)

The schema and its migrations for older databases are in `schema.py`.

Version states move as `records.ALLOWED_MOVES` says (anything else raises
`InvalidVersionError`); `activate` is the only way into `active`, `record_staged` the only way
out of `failed`.

Invariants:
    * Each method that changes anything runs in ONE transaction, and appends its event(s) in that
      same transaction: after a crash the event log and the states agree.
    * Transactions use `Database.atomic()`, not `with db.conn:`. With sqlite-utils 4 every
      `execute` outside an open transaction commits at once, so `with db.conn:` would let each
      statement commit separately; `atomic()` issues BEGIN/COMMIT and nests with savepoints.
    * At most one version per model is active (a partial unique index enforces it).
    * Times come from the injected clock (epoch seconds); "now" is read once per transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from model_cache.errors import (
    CacheError,
    CacheFullError,
    InvalidVersionError,
    VersionNotFoundError,
)
from model_cache.records import (
    ALLOWED_MOVES,
    CacheEvent,
    FileRecord,
    RejectedVersion,
    RejectionCause,
    VersionRecord,
    VersionState,
)
from model_cache.schema import migrate


def _version(row: Mapping[str, Any]) -> VersionRecord:
    return VersionRecord(**{**row, "state": VersionState(row["state"])})


@contextmanager
def _translate_sqlite() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        if "full" in str(exc).lower():
            raise CacheFullError(f"state database: {exc}") from exc
        raise CacheError(f"state database: {exc}") from exc


class StateDB:
    """The state database of one cache root.

    Args:
        path: The SQLite file (created with its schema if missing).
        clock: Returns "now" in epoch seconds; injected so tests control time.

    Raises:
        CacheError: The file is not a usable SQLite database, or one from a newer agent (see
            `schema.py`). Every method raises `CacheError`
            (`CacheFullError` when the disk is full) for database errors, so that is not
            repeated on each.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        with _translate_sqlite():
            conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
            self._db = Database(conn)
            self._db.enable_wal()
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            try:
                migrate(self._db)
            except BaseException:
                conn.close()
                raise

    @property
    def journal_mode(self) -> str:
        """SQLite's journal mode ('wal' once open)."""
        with self._lock, _translate_sqlite():
            return str(self._db.journal_mode)

    def close(self) -> None:
        """Close the connection; the object is unusable afterwards."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[float]:
        with self._lock, _translate_sqlite(), self._db.atomic():
            yield self._clock()

    def _event(
        self,
        now: float,
        kind: str,
        model: str | None,
        version: int | None,
        detail: Mapping[str, Any] | None,
    ) -> int:
        row = {
            "time": now,
            "model": model,
            "version": version,
            "kind": kind,
            "detail": json.dumps(dict(detail or {}), sort_keys=True, default=str),
        }
        table = self._db.table("events").insert(row)
        return int(table.last_rowid or 0)

    def require(self, model: str, version: int) -> VersionRecord:
        """One version's row; raises `VersionNotFoundError` when there is none."""
        record = self.get(model, version)
        if record is None:
            raise VersionNotFoundError(
                f"no version {version} of {model} in the cache", model=model, version=version
            )
        return record

    def record_staged(
        self, model: str, version: int, digest: str, files: Sequence[FileRecord]
    ) -> VersionRecord:
        """Record a version being installed (state staged), with its files.

        A previous row for the same version is replaced only when it is failed.

        Args:
            model: Model name.
            version: Version number.
            digest: SHA-256 of the version's manifest.
            files: Every file of the version.

        Raises:
            InvalidVersionError: The version exists in a state other than failed.

        Returns:
            The new row.
        """
        with self._transaction() as now:
            old = self.get(model, version)
            if old is not None and old.state is not VersionState.FAILED:
                raise InvalidVersionError(
                    f"{model} version {version} is already {old.state.value}",
                    model=model,
                    version=version,
                )
            self._db.execute(
                "INSERT OR IGNORE INTO models (name, created_at) VALUES (?, ?)", [model, now]
            )
            self._db.table("versions").delete_where("model = ? AND version = ?", [model, version])
            row = {"model": model, "version": version, "digest": digest, "state": "staged"}
            row |= {"reason": None, "created_at": now, "activated_at": None, "last_used": now}
            self._db.table("versions").insert(row)
            self._db.table("files").insert_all(
                {"model": model, "version": version, **asdict(f)} for f in files
            )
            self._event(now, "staged", model, version, {"digest": digest, "files": len(files)})
        return self.require(model, version)

    def set_state(
        self,
        model: str,
        version: int,
        state: VersionState,
        reason: str | None = None,
        *,
        kind: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> VersionRecord:
        """Move a version to a new state (not `active`: use `activate`).

        Args:
            model: Model name.
            version: Version number.
            state: The new state.
            reason: Why (kept on the row; required in practice for `failed`).
            kind: Event kind; defaults to the state's name.
            detail: Extra event fields.

        Raises:
            VersionNotFoundError: Unknown version.
            InvalidVersionError: A move the state machine forbids.

        Returns:
            The updated row.
        """
        with self._transaction() as now:
            old = self.require(model, version)
            if state not in ALLOWED_MOVES[old.state]:
                raise InvalidVersionError(
                    f"{model} version {version}: cannot go from {old.state.value} to {state.value}",
                    model=model,
                    version=version,
                )
            updates: dict[str, Any] = {"state": state.value, "reason": reason}
            if old.state is VersionState.ACTIVE:
                updates["last_used"] = now
            self._db.table("versions").update((model, version), updates)
            body = {"digest": old.digest, "from": old.state.value, **(detail or {})}
            if reason is not None:
                body["reason"] = reason
            self._event(now, kind or state.value, model, version, body)
        return self.require(model, version)

    def activate(
        self,
        model: str,
        version: int,
        *,
        kind: str = "activated",
        detail: Mapping[str, Any] | None = None,
    ) -> VersionRecord | None:
        """Make a ready or retired version active and retire the model's previous active one.

        Args:
            model: Model name.
            version: Version number.
            kind: Event kind ("activated", "rolled-back", "auto-rollback").
            detail: Extra event fields.

        Raises:
            VersionNotFoundError: Unknown version.
            InvalidVersionError: Not ready, retired or active.

        Returns:
            The previously active version's row as it was, or None.
        """
        with self._transaction() as now:
            target = self.require(model, version)
            if target.state is VersionState.ACTIVE:
                return None
            if target.state not in {VersionState.READY, VersionState.RETIRED}:
                raise InvalidVersionError(
                    f"{model} version {version} is {target.state.value}, cannot activate",
                    model=model,
                    version=version,
                )
            previous = self.active_version(model)
            if previous is not None:
                self._db.table("versions").update(
                    (model, previous.version),
                    {"state": VersionState.RETIRED.value, "last_used": now},
                )
            self._db.table("versions").update(
                (model, version),
                {"state": "active", "reason": None, "activated_at": now, "last_used": now},
            )
            body: dict[str, Any] = {"digest": target.digest, **(detail or {})}
            body["previous"] = previous.version if previous else None
            self._event(now, kind, model, version, body)
        return previous

    def delete_version(
        self, model: str, version: int, *, kind: str = "evicted", detail: Mapping[str, Any]
    ) -> None:
        """Forget a version and its files (the caller removes its folder afterwards).

        Args:
            model: Model name.
            version: Version number.
            kind: Event kind.
            detail: Event fields (e.g. the reason).

        Raises:
            VersionNotFoundError: Unknown version.
            InvalidVersionError: The version is active.
        """
        with self._transaction() as now:
            old = self.require(model, version)
            if old.state is VersionState.ACTIVE:
                raise InvalidVersionError(
                    f"{model} version {version} is active", model=model, version=version
                )
            self._db.table("files").delete_where("model = ? AND version = ?", [model, version])
            self._db.table("versions").delete_where("model = ? AND version = ?", [model, version])
            body = {"digest": old.digest, "state": old.state.value, **detail}
            self._event(now, kind, model, version, body)

    def touch(self, model: str, version: int) -> None:
        """Set a version's `last_used` to now (GC evicts least recently used first)."""
        with self._transaction() as now:
            self._db.execute(
                "UPDATE versions SET last_used = ? WHERE model = ? AND version = ?",
                [now, model, version],
            )

    def add_event(
        self,
        kind: str,
        model: str | None = None,
        version: int | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> int:
        """Append an event on its own (for facts that change no state, e.g. a view rebuild).

        Returns:
            The new event's id.
        """
        with self._transaction() as now:
            return self._event(now, kind, model, version, detail)

    def reject(
        self,
        model: str,
        version: int,
        cause: RejectionCause,
        reason: str,
        digest: str | None,
    ) -> RejectedVersion | None:
        """Mark a version rejected on this device (replacing an earlier rejection of it).

        Args:
            model: Model name.
            version: Version number (it need not be in the cache).
            cause: Why.
            reason: The message to show.
            digest: The content rejected, when known.

        Returns:
            The rejection it replaced, or None when the version was not rejected.
        """
        with self._transaction() as now:
            old = self._rejected("model = ? AND version = ?", [model, version])
            row = {"model": model, "version": version, "cause": cause.value, "reason": reason}
            row |= {"digest": digest, "rejected_at": now}
            self._db.table("rejected").insert(row, replace=True)
            self._event(now, "rejected", model, version, {"cause": cause.value, "reason": reason})
        return old[0] if old else None

    def clear_rejected(
        self, model: str | None, version: int | None = None, *, by: str
    ) -> list[RejectedVersion]:
        """Forget rejections: the sync may activate those versions again.

        Args:
            model: One model, or None for every model.
            version: One version of `model`, or None for all of them.
            by: What cleared them (an event field: "activate", "set-desired", ...).

        Returns:
            The rejections removed.
        """
        where, params = _rejected_where(model, version)
        with self._transaction() as now:
            gone = self._rejected(where, params)
            for item in gone:
                self._db.table("rejected").delete((item.model, item.version))
                detail = {"cause": item.cause.value, "reason": item.reason, "by": by}
                self._event(now, "rejection-cleared", item.model, item.version, detail)
        return gone

    def rejected(self, model: str | None = None) -> list[RejectedVersion]:
        """Rejected versions, by model then version (of one model, or of all)."""
        return self._rejected(*_rejected_where(model, None))

    def _rejected(self, where: str, params: Sequence[Any]) -> list[RejectedVersion]:
        rows = self._query(f"SELECT * FROM rejected WHERE {where} ORDER BY model, version", params)  # noqa: S608
        return [RejectedVersion(**{**r, "cause": RejectionCause(r["cause"])}) for r in rows]

    def get(self, model: str, version: int) -> VersionRecord | None:
        """One version's row, or None."""
        rows = self._query(
            "SELECT * FROM versions WHERE model = ? AND version = ?", [model, version]
        )
        return _version(rows[0]) if rows else None

    def active_version(self, model: str) -> VersionRecord | None:
        """The model's active version, or None."""
        rows = self._query("SELECT * FROM versions WHERE model = ? AND state = 'active'", [model])
        return _version(rows[0]) if rows else None

    def versions(
        self, model: str | None = None, states: Sequence[VersionState] | None = None
    ) -> list[VersionRecord]:
        """Versions ordered by model then version, optionally of one model or in some states."""
        clauses, params = [], []
        if model is not None:
            clauses.append("model = ?")
            params.append(model)
        if states is not None:
            clauses.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(s.value for s in states)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._query(f"SELECT * FROM versions{where} ORDER BY model, version", params)  # noqa: S608
        return [_version(r) for r in rows]

    def files(self, model: str, version: int) -> list[FileRecord]:
        """A version's files, sorted by path."""
        rows = self._query(
            "SELECT path, digest, size FROM files WHERE model = ? AND version = ? ORDER BY path",
            [model, version],
        )
        return [FileRecord(r["path"], r["digest"], r["size"]) for r in rows]

    def referenced_digests(self) -> set[str]:
        """Blob digests used by any version that is not failed."""
        rows = self._query(
            "SELECT DISTINCT f.digest FROM files f JOIN versions v"
            " ON f.model = v.model AND f.version = v.version WHERE v.state != 'failed'",
            [],
        )
        return {r["digest"] for r in rows}

    def events(self, since_id: int = 0, limit: int = 1000) -> list[CacheEvent]:
        """Events with id > `since_id`, oldest first, at most `limit`."""
        rows = self._query(
            "SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", [since_id, limit]
        )
        return [
            CacheEvent(
                r["id"], r["time"], r["model"], r["version"], r["kind"], json.loads(r["detail"])
            )
            for r in rows
        ]

    def _query(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        with self._lock, _translate_sqlite():
            return list(self._db.query(sql, list(params)))


def _rejected_where(model: str | None, version: int | None) -> tuple[str, list[Any]]:
    if model is None:
        return "1 = 1", []
    if version is None:
        return "model = ?", [model]
    return "model = ? AND version = ?", [model, version]
