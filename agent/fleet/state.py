"""The fleet link's durable state: command ids already seen (with their responses) and the
desired state the fleet manager set.

Invariants:
    * A command id is recorded as `running` before the command executes, in its own commit, and
      gets its response when done. A duplicate delivery of an id is answered from here and never
      executed again; one that finds `running` after a restart (the agent died mid-command) is
      answered with an error saying so: at most once, never twice.
    * Bounded: the newest `max_ids` ids are kept (older ones are pruned on insert). A duplicate
      arriving after that many newer commands would run again; brokers redeliver within seconds.
    * The desired state is replaced as a whole, in one transaction.
    * Each commit is durable when its call returns (`synchronous=FULL`, `agent.wire.sqlite`): the
      `running` record of a command outlives a power cut during the command, so at most once
      holds across cuts too, not only across kill -9.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.wire.sqlite import open_database, translate_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, command TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')), response TEXT,
    received REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS desired (
    model TEXT PRIMARY KEY, policy TEXT NOT NULL, updated REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class SeenCommand:
    """A command id recorded earlier: its response, or None if it never finished."""

    id: str
    command: str
    response: Mapping[str, Any] | None


class FleetState:
    """Command ids and desired state in SQLite (see module docstring).

    Args:
        path: The SQLite file (the outbox may share it).
        max_ids: How many command ids to remember.
        clock: Epoch seconds.

    Raises:
        StoreError: the database cannot be opened; every method raises it on database errors.
    """

    def __init__(
        self, path: Path, *, max_ids: int = 1000, clock: Callable[[], float] = time.time
    ) -> None:
        self._max_ids = max_ids
        self._clock = clock
        self._lock = threading.Lock()
        self._db = open_database(path, _SCHEMA)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def seen(self, command_id: str) -> SeenCommand | None:
        """The earlier delivery of this id, if any."""
        with self._lock, translate_sqlite("fleet state"):
            row = self._db.execute(
                "SELECT command, response FROM commands WHERE id = ?", [command_id]
            ).fetchone()
        if row is None:
            return None
        return SeenCommand(command_id, row[0], json.loads(row[1]) if row[1] else None)

    def begin(self, command_id: str, command: str) -> bool:
        """Record an id before executing its command.

        Returns:
            False if the id was already recorded (a duplicate: do not execute).
        """
        with self._lock, translate_sqlite("fleet state"), self._db.atomic():
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO commands (id, command, state, received) "
                "VALUES (?, ?, 'running', ?)",
                [command_id, command, self._clock()],
            )
            if cursor.rowcount == 0:
                return False
            self._db.execute(
                "DELETE FROM commands WHERE n <= (SELECT MAX(n) FROM commands) - ?",
                [self._max_ids],
            )
            return True

    def finish(self, command_id: str, response: Mapping[str, Any]) -> None:
        """Store the response of a command that ran."""
        text = json.dumps(response, separators=(",", ":"), sort_keys=True, default=str)
        with self._lock, translate_sqlite("fleet state"), self._db.atomic():
            self._db.execute(
                "UPDATE commands SET state = 'done', response = ? WHERE id = ?",
                [text, command_id],
            )

    def desired(self) -> tuple[tuple[str, str], ...]:
        """The desired state: (model or "*", policy) pairs sorted by model."""
        with self._lock, translate_sqlite("fleet state"):
            rows = self._db.execute("SELECT model, policy FROM desired ORDER BY model").fetchall()
        return tuple((str(m), str(p)) for m, p in rows)

    def set_desired(self, models: tuple[tuple[str, str], ...]) -> None:
        """Replace the desired state."""
        now = self._clock()
        with self._lock, translate_sqlite("fleet state"), self._db.atomic():
            self._db.execute("DELETE FROM desired")
            for model, policy in models:
                self._db.execute(
                    "INSERT INTO desired (model, policy, updated) VALUES (?, ?, ?)",
                    [model, policy, now],
                )
