"""The state database's schema and its migrations (SQLite's `PRAGMA user_version`).

    migrate(db)   # at open: creates a new database, or brings an older one up to date

Versions:
    0/1  models, versions, files, events (databases made before versioning say 0)
    2    + rejected: versions this device refuses to activate by itself, with their reason

Invariants:
    * Migrations only add (tables, indexes); they never rewrite or drop rows, so an existing
      cache keeps every version, file and event it had.
    * One migration runs in one transaction with the `user_version` bump: a crash (kill -9,
      power cut) leaves the database at the old version or the new one, never in between, and
      the next open simply runs it again.
    * A database from a newer agent (a higher `user_version`) is refused rather than guessed at.
"""

from __future__ import annotations

from sqlite_utils import Database

from model_cache.errors import CacheError

SCHEMA_VERSION = 2

_BASE = """
CREATE TABLE IF NOT EXISTS models (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    model TEXT NOT NULL REFERENCES models(name), version INTEGER NOT NULL CHECK (version > 0),
    digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('staged', 'ready', 'active', 'retired', 'failed')),
    reason TEXT, created_at REAL NOT NULL, activated_at REAL, last_used REAL NOT NULL,
    PRIMARY KEY (model, version)
);
CREATE UNIQUE INDEX IF NOT EXISTS versions_one_active ON versions(model) WHERE state = 'active';
CREATE TABLE IF NOT EXISTS files (
    model TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
    digest TEXT NOT NULL, size INTEGER NOT NULL,
    PRIMARY KEY (model, version, path),
    FOREIGN KEY (model, version) REFERENCES versions(model, version) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS files_digest ON files(digest);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
    model TEXT, version INTEGER, kind TEXT NOT NULL, detail TEXT NOT NULL
)
"""

# Not tied to `versions` by a foreign key: a rejection outlives the eviction of its version, so
# that the sync does not download it again just to fail again.
_REJECTED = """
CREATE TABLE IF NOT EXISTS rejected (
    model TEXT NOT NULL, version INTEGER NOT NULL CHECK (version > 0),
    cause TEXT NOT NULL CHECK (cause IN ('failed', 'rolled-back')),
    reason TEXT NOT NULL, digest TEXT, rejected_at REAL NOT NULL,
    PRIMARY KEY (model, version)
)
"""

#: user_version reached → the statements that reach it from the one before.
_MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _BASE), (2, _REJECTED))


def migrate(db: Database) -> int:
    """Create the schema, or add what an older database lacks.

    Args:
        db: The open database (outside any transaction).

    Raises:
        CacheError: The database was written by a newer agent (schema unknown here).
        sqlite3.Error: The database cannot be read or written (the caller translates it).

    Returns:
        The schema version before the migration (0 for a new or unversioned database).
    """
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise CacheError(
            f"state database schema {found} is newer than this agent's ({SCHEMA_VERSION}); "
            "upgrade the agent"
        )
    for target, script in _MIGRATIONS:
        if found >= target:
            continue
        with db.atomic():  # BEGIN ... COMMIT around every statement and the version bump
            for statement in filter(str.strip, script.split(";")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {target:d}")
    return found
