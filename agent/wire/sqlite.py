"""The SQLite files of the fleet's stores, opened one way on both sides: the device's outbox and
command state (`agent.fleet`), the manager's rollouts (`agent.manager.rollout_store`).

Every store opens its file with `open_database` (WAL, its schema applied in one transaction) and
wraps each operation in `translate_sqlite`, so a broken file is one `StoreError` naming the store.

Durability: a transaction that returned is on disk, power cut included. That takes three things,
each shown by the power-cut tests (tests/powercut/):

    * `synchronous=FULL`: in WAL mode SQLite then fsyncs the WAL at every commit. NORMAL fsyncs it
      only at checkpoints, so a power cut loses every commit since the last one (an outbox event
      reported stored, a command recorded as running, a rollout step).
    * The folders created for the file are made durable (each new folder's parent fsynced):
      otherwise a cut can drop the folder, and the database with it, whatever SQLite synced.
    * A new file's own name is made durable at once (its folder fsynced after the schema commit),
      rather than whenever SQLite next syncs that folder.
"""

from __future__ import annotations

import os
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_dirs(path: Path) -> None:
    """`mkdir -p`, with each new folder's entry fsynced into its parent (agent.wire stands
    below model_cache in the layering, so `model_cache.atomic.ensure_dir` is not used here)."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        _fsync_dir(folder.parent)


def open_database(path: Path, schema: str) -> Database:
    """Open (or create) a SQLite file in WAL mode, `synchronous=FULL`, with `schema` applied.

    Raises:
        StoreError: not a usable database, or its folder cannot be created.
    """
    try:
        _durable_dirs(path.parent)
    except OSError as exc:
        raise StoreError(f"{path}: cannot create its folder: {exc.strerror}") from exc
    created = not path.exists()
    with translate_sqlite(str(path)):
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
        db = Database(conn)
        db.enable_wal()
        db.execute("PRAGMA synchronous=FULL")
        with db.atomic():
            db.executescript(schema)
    if created:
        try:
            _fsync_dir(path.parent)
        except OSError as exc:
            db.close()
            raise StoreError(f"{path}: cannot flush its folder: {exc.strerror}") from exc
    return db
