"""The SQLite files of the fleet's stores, opened one way on both sides: the device's outbox and
command state (`agent.fleet`), the manager's rollouts (`agent.manager.rollout_store`).

Every store opens its file with `open_database` (WAL, its schema applied in one transaction) and
wraps each operation in `translate_sqlite`, so a broken file is one `StoreError` naming the store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

__all__ = ["StoreError", "open_database", "translate_sqlite"]


class StoreError(Exception):
    """A fleet SQLite store (outbox, command ids, desired state) failed."""


@contextmanager
def translate_sqlite(what: str) -> Iterator[None]:
    """Turn `sqlite3.Error` into `StoreError` naming the store."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"{what}: {exc}") from exc


def open_database(path: Path, schema: str) -> Database:
    """Open (or create) a SQLite file in WAL mode with `schema` applied.

    Raises:
        StoreError: not a usable database.
    """
    with translate_sqlite(str(path)):
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
        db = Database(conn)
        db.enable_wal()
        db.execute("PRAGMA synchronous=NORMAL")
        with db.atomic():
            db.executescript(schema)
        return db
