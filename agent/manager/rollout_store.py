"""Rollouts on the manager's side, in SQLite: state, events and operator requests.

Invariants:
    * A rollout's state (`Rollout.to_json`) and the events of the step that produced it are
      written in one transaction (WAL, `synchronous=FULL`: durable when `save` returns, power
      cut included), so a manager killed or cut off at any point resumes from the last step it
      finished; the commands of an unfinished step are sent again with the same ids (the
      devices deduplicate them). A wave saved as done stays done.
    * `create` is idempotent: the same id with the same spec returns the stored rollout; another
      spec under that id, or a second unfinished rollout of the same model, is refused.
    * Operators' `pause`, `resume` and `abort` from another process are queued requests the
      driver applies at its next step; the driver's heartbeat says whether one runs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import DONE
from agent.wire.sqlite import open_database, translate_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, model TEXT NOT NULL, phase TEXT NOT NULL, state TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL,
    driver_pid INTEGER, driver_seen REAL
);
CREATE TABLE IF NOT EXISTS rollout_events (
    n INTEGER PRIMARY KEY AUTOINCREMENT, rollout TEXT NOT NULL, ts REAL NOT NULL,
    event TEXT NOT NULL, doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_requests (
    n INTEGER PRIMARY KEY AUTOINCREMENT, rollout TEXT NOT NULL, action TEXT NOT NULL,
    ts REAL NOT NULL
);
"""
ACTIONS = ("pause", "resume", "abort")


class RolloutConflictError(ValueError):
    """A rollout that cannot be created (another spec under its id, or the model is busy)."""


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, default=str)


class RolloutStore:
    """The rollouts database (see module docstring).

    Raises:
        StoreError: the database cannot be opened; every method raises it on database errors.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_database(path, _SCHEMA)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def create(self, rollout: Rollout, now: float) -> Rollout:
        """Store a new rollout, or return the one stored under its id with the same spec.

        Raises:
            RolloutConflictError: see module docstring.
        """
        spec = rollout.spec
        with self._lock, translate_sqlite("rollouts"), self._db.atomic():
            row = self._db.execute("SELECT state FROM rollouts WHERE id = ?", [spec.id]).fetchone()
            if row is not None:
                stored = Rollout.from_json(json.loads(row[0]))
                if asdict(stored.spec) != asdict(spec):
                    raise RolloutConflictError(
                        f"rollout {spec.id} exists with another spec (see `rollout status`)"
                    )
                return stored
            busy = self._db.execute(
                "SELECT id FROM rollouts WHERE model = ? AND phase NOT IN (?, ?)",
                [spec.model, *sorted(DONE)],
            ).fetchone()
            if busy is not None:
                raise RolloutConflictError(
                    f"rollout {busy[0]} of model {spec.model} has not finished: "
                    "resume or abort it first"
                )
            self._db.execute(
                "INSERT INTO rollouts (id, model, phase, state, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [spec.id, spec.model, rollout.phase, _dumps(rollout.to_json()), now, now],
            )
            self._insert_events(spec.id, rollout.take_events())
        return rollout

    def save(self, rollout: Rollout, now: float) -> list[dict[str, Any]]:
        """Store the state and the events since the last save, in one transaction.

        Returns:
            The events stored.
        """
        events = rollout.take_events()
        with self._lock, translate_sqlite("rollouts"), self._db.atomic():
            self._db.execute(
                "UPDATE rollouts SET phase = ?, state = ?, updated = ? WHERE id = ?",
                [rollout.phase, _dumps(rollout.to_json()), now, rollout.spec.id],
            )
            self._insert_events(rollout.spec.id, events)
        return events

    def _insert_events(self, rollout_id: str, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self._db.execute(
                "INSERT INTO rollout_events (rollout, ts, event, doc) VALUES (?, ?, ?, ?)",
                [rollout_id, event["ts"], event["event"], _dumps(event)],
            )

    def load(self, rollout_id: str) -> Rollout | None:
        """The stored rollout (None: unknown id)."""
        with self._lock, translate_sqlite("rollouts"):
            row = self._db.execute(
                "SELECT state FROM rollouts WHERE id = ?", [rollout_id]
            ).fetchone()
        return Rollout.from_json(json.loads(row[0])) if row else None

    def latest(self) -> str | None:
        """The id of the rollout created last (None: none yet)."""
        with self._lock, translate_sqlite("rollouts"):
            row = self._db.execute(
                "SELECT id FROM rollouts ORDER BY created DESC, rowid DESC LIMIT 1"
            ).fetchone()
        return str(row[0]) if row else None

    def events(self, rollout_id: str, since: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """(n, event) of a rollout after `since`, oldest first."""
        with self._lock, translate_sqlite("rollouts"):
            rows = self._db.execute(
                "SELECT n, doc FROM rollout_events WHERE rollout = ? AND n > ? ORDER BY n",
                [rollout_id, since],
            ).fetchall()
        return [(int(n), json.loads(doc)) for n, doc in rows]

    def request(self, rollout_id: str, action: str, now: float) -> None:
        """Queue an operator's pause/resume/abort for the driver."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
        with self._lock, translate_sqlite("rollouts"), self._db.atomic():
            self._db.execute(
                "INSERT INTO rollout_requests (rollout, action, ts) VALUES (?, ?, ?)",
                [rollout_id, action, now],
            )

    def take_requests(self, rollout_id: str) -> list[tuple[str, float]]:
        """The queued requests, oldest first; they are removed."""
        with self._lock, translate_sqlite("rollouts"), self._db.atomic():
            rows = self._db.execute(
                "SELECT n, action, ts FROM rollout_requests WHERE rollout = ? ORDER BY n",
                [rollout_id],
            ).fetchall()
            self._db.execute("DELETE FROM rollout_requests WHERE rollout = ?", [rollout_id])
        return [(str(a), float(t)) for _n, a, t in rows]

    def heartbeat(self, rollout_id: str, pid: int | None, now: float) -> None:
        """The driver `pid` runs the rollout now (None: it stopped)."""
        with self._lock, translate_sqlite("rollouts"), self._db.atomic():
            self._db.execute(
                "UPDATE rollouts SET driver_pid = ?, driver_seen = ? WHERE id = ?",
                [pid, now if pid is not None else None, rollout_id],
            )

    def driver(self, rollout_id: str, now: float, stale_s: float = 5.0) -> int | None:
        """The pid of the driver running the rollout (None: none seen within `stale_s`, or its
        process is gone)."""
        with self._lock, translate_sqlite("rollouts"):
            row = self._db.execute(
                "SELECT driver_pid, driver_seen FROM rollouts WHERE id = ?", [rollout_id]
            ).fetchone()
        if row is None or row[0] is None or row[1] is None or now - row[1] > stale_s:
            return None
        return int(row[0]) if _alive(int(row[0])) else None


def _alive(pid: int) -> bool:
    """Whether a process with this pid runs (on this host: managers share a local file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
