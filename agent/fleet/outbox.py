"""Store and forward: a bounded SQLite outbox for telemetry and events.

Every telemetry message and event goes into the outbox first; the fleet link's forwarder takes
the oldest rows, publishes them at QoS 1 and deletes them once the broker acknowledged. So the
same path serves a connected and a disconnected agent, and a restart resends what was not
acknowledged.

Invariants:
    * Rows leave in `seq` order (SQLite AUTOINCREMENT: never reused, even after a restart), and
      each payload carries its `seq`, so a receiver can put them in order and drop duplicates
      (delivery is at least once: a crash between PUBACK and delete resends a row).
    * At most `max_messages` rows. When a new row does not fit, the oldest telemetry row goes
      first; events are dropped only when no telemetry is left. Rows handed to the forwarder and
      not yet acknowledged ("in flight") are never dropped, so a dropped row was never delivered
      and the drop counters are exact. They are persisted with the rows, in the same transaction.
    * Thread-safe (one lock); events may be recorded from worker threads.
    * Stored means on disk: `put` returns once its commit is durable (WAL, `synchronous=FULL`,
      `agent.wire.sqlite`), so an event the agent reported stored survives a power cut, and so
      does an `ack`'s delete (a row acknowledged before a cut is not sent again). A cut between
      PUBACK and that delete resends the row: the at-least-once rule above. tests/powercut/ cuts
      the power at every fsync of a run and checks both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.wire.sqlite import open_database, translate_sqlite

Kind = Literal["telemetry", "event"]
KINDS: tuple[Kind, ...] = ("telemetry", "event")  # drop order: telemetry first

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, topic TEXT NOT NULL,
    body TEXT NOT NULL, created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_kind ON outbox(kind, seq);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One queued message; `payload` is its JSON body with `seq` added."""

    seq: int
    kind: Kind
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """Rows waiting, and rows dropped since the outbox was created (exact, persisted)."""

    queued: int
    dropped_telemetry: int
    dropped_events: int
    last_seq: int = 0  # the newest row's seq (0: none yet)

    def to_json(self) -> dict[str, int]:
        """The `outbox` object of telemetry."""
        return {
            "queued": self.queued,
            "dropped_telemetry": self.dropped_telemetry,
            "dropped_events": self.dropped_events,
            "last_seq": self.last_seq,
        }


class Outbox:
    """The bounded store-and-forward queue (see module docstring).

    Args:
        path: The SQLite file (shared with the other fleet stores is fine).
        max_messages: The bound; at least 8.
        clock: Epoch seconds, for the `created` column.

    Raises:
        ValueError: `max_messages` below 8.
        StoreError: the database cannot be opened; every method raises it on database errors.
    """

    def __init__(
        self, path: Path, *, max_messages: int, clock: Callable[[], float] = time.time
    ) -> None:
        if max_messages < 8:
            raise ValueError(f"max_messages must be >= 8, got {max_messages}")
        self.max_messages = max_messages
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight: set[int] = set()
        self._db = open_database(path, _SCHEMA)

    @property
    def max_take(self) -> int:
        """The most rows in flight at once: a quarter of the bound, so drops stay possible."""
        return max(1, min(32, self.max_messages // 4))

    def close(self) -> None:
        """Close the database; unacknowledged rows stay for the next start."""
        with self._lock:
            self._db.close()

    def put(self, kind: Kind, topic: str, body: Mapping[str, Any]) -> int:
        """Queue a message, dropping the oldest telemetry (then event) row when full.

        Returns:
            The message's `seq`.
        """
        text = json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)
        with self._lock, translate_sqlite("outbox"), self._db.atomic():
            count = self._count()
            while count >= self.max_messages and self._drop_oldest():
                count -= 1
            cursor = self._db.execute(
                "INSERT INTO outbox (kind, topic, body, created) VALUES (?, ?, ?, ?)",
                [kind, topic, text, self._clock()],
            )
            return int(cursor.lastrowid or 0)

    def take(self, limit: int) -> list[OutboxRow]:
        """The oldest rows not in flight (at most `limit`, capped at `max_take`), now in flight."""
        limit = max(0, min(limit, self.max_take - len(self._inflight)))
        with self._lock, translate_sqlite("outbox"):
            rows = self._db.execute(
                f"SELECT seq, kind, topic, body FROM outbox WHERE seq NOT IN ({self._marks()}) "  # noqa: S608
                "ORDER BY seq LIMIT ?",
                [*self._inflight, limit],
            ).fetchall()
            found = [_row(seq, kind, topic, body) for seq, kind, topic, body in rows]
            self._inflight.update(r.seq for r in found)
            return found

    def ack(self, seqs: Iterable[int]) -> None:
        """The broker has these rows: delete them."""
        done = list(seqs)
        if not done:
            return
        with self._lock, translate_sqlite("outbox"), self._db.atomic():
            self._db.execute(
                f"DELETE FROM outbox WHERE seq IN ({', '.join('?' * len(done))})",  # noqa: S608
                done,
            )
            self._inflight.difference_update(done)

    def release(self) -> None:
        """Forget which rows are in flight (their publishes were abandoned): take them again."""
        with self._lock:
            self._inflight.clear()

    def stats(self) -> OutboxStats:
        """Queued rows and the drop counters."""
        with self._lock, translate_sqlite("outbox"):
            counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            last = self._db.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'"
            ).fetchone()
            return OutboxStats(
                queued=self._count(),
                dropped_telemetry=int(counters.get("dropped_telemetry", 0)),
                dropped_events=int(counters.get("dropped_event", 0)),
                last_seq=int(last[0]) if last else 0,
            )

    def _count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def _marks(self) -> str:
        return ", ".join("?" * len(self._inflight))

    def _drop_oldest(self) -> bool:
        for kind in KINDS:
            victim = self._db.execute(
                f"SELECT seq FROM outbox WHERE kind = ? AND seq NOT IN ({self._marks()}) "  # noqa: S608
                "ORDER BY seq LIMIT 1",
                [kind, *self._inflight],
            ).fetchone()
            if victim is not None:
                self._db.execute("DELETE FROM outbox WHERE seq = ?", [victim[0]])
                self._db.execute(
                    "INSERT INTO counters (name, value) VALUES (?, 1) "
                    "ON CONFLICT(name) DO UPDATE SET value = value + 1",
                    [f"dropped_{kind}"],
                )
                return True
        return False


def _row(seq: int, kind: str, topic: str, body: str) -> OutboxRow:
    doc = json.loads(body)
    doc["seq"] = seq
    payload = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return OutboxRow(seq, "event" if kind == "event" else "telemetry", topic, payload)
