"""Rejected versions: durable, outlive eviction, cleared by an operator; the schema migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from model_cache import CacheError, ModelCache, RejectionCause, StateDB
from model_cache.schema import SCHEMA_VERSION
from tests.fakes import FakeClock
from tests.model_cache.support import MakeSource, OpenCache

FAILED = RejectionCause.FAILED
ROLLED_BACK = RejectionCause.ROLLED_BACK


def test_reject_is_durable_and_recorded(open_cache: OpenCache, src: MakeSource) -> None:
    cache = open_cache()
    cache.install("m", 2, src(2))
    assert cache.rejections.reject("m", 2, FAILED, "warm-up failed") is None
    previous = cache.rejections.reject("m", 2, ROLLED_BACK, "an operator rolled back")
    assert previous is not None
    assert previous.reason == "warm-up failed"
    cache.close()  # a restart (the kill -9 case is SQLite's: synchronous=FULL, one transaction)
    again = open_cache()
    [item] = again.rejections.entries()
    assert (item.model, item.version, item.cause, item.reason) == (
        "m",
        2,
        ROLLED_BACK,
        "an operator rolled back",
    )
    assert item.digest == again.get("m", 2).digest
    kinds = [(e.kind, e.version, e.detail.get("cause")) for e in again.events()]
    assert ("rejected", 2, "failed") in kinds
    assert ("rejected", 2, "rolled-back") in kinds


def test_a_rejection_outlives_the_eviction_of_its_version(
    cache: ModelCache, src: MakeSource
) -> None:
    cache.install("m", 1, src(1))
    cache.rejections.reject("m", 1, FAILED, "does not load")
    cache.evict("m", 1, reason="gc")
    assert [r.version for r in cache.rejections.entries("m")] == [1]
    cache.rejections.reject("m", 7, FAILED, "never cached here")  # no row: no digest
    assert cache.rejections.entries("m")[-1].digest is None


def test_clear_one_all_of_a_model_or_everything(cache: ModelCache) -> None:
    for model, version in (("a", 1), ("a", 2), ("b", 1)):
        cache.rejections.reject(model, version, FAILED, "x")
    assert [r.version for r in cache.rejections.clear("a", 2, by="activate")] == [2]
    assert cache.rejections.clear("a", 2, by="activate") == []
    assert [(r.model, r.version) for r in cache.rejections.clear("a", by="set-desired")] == [
        ("a", 1)
    ]
    assert [(r.model, r.version) for r in cache.rejections.clear(by="clear-rejected")] == [("b", 1)]
    cleared = [e for e in cache.events() if e.kind == "rejection-cleared"]
    assert [e.detail["by"] for e in cleared] == ["activate", "set-desired", "clear-rejected"]


def test_bad_names_are_refused(cache: ModelCache) -> None:
    with pytest.raises(CacheError):
        cache.rejections.reject("../x", 1, FAILED, "x")
    with pytest.raises(CacheError):
        cache.rejections.reject("m", 0, FAILED, "x")


_OLD_SCHEMA = """
CREATE TABLE models (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE versions (
    model TEXT NOT NULL REFERENCES models(name), version INTEGER NOT NULL CHECK (version > 0),
    digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('staged', 'ready', 'active', 'retired', 'failed')),
    reason TEXT, created_at REAL NOT NULL, activated_at REAL, last_used REAL NOT NULL,
    PRIMARY KEY (model, version)
);
CREATE TABLE files (
    model TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL,
    digest TEXT NOT NULL, size INTEGER NOT NULL, PRIMARY KEY (model, version, path)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
    model TEXT, version INTEGER, kind TEXT NOT NULL, detail TEXT NOT NULL
);
INSERT INTO models VALUES ('m', 1.0);
INSERT INTO versions VALUES ('m', 1, 'd1', 'active', NULL, 1.0, 1.0, 1.0);
INSERT INTO events (time, model, version, kind, detail) VALUES (1.0, 'm', 1, 'activated', '{}');
"""


def test_a_database_from_before_rejections_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as old:  # as the previous agent left it: user_version 0
        old.executescript(_OLD_SCHEMA)
    old.close()
    db = StateDB(path, clock=FakeClock())
    try:
        assert [(v.model, v.version, v.state.value) for v in db.versions()] == [("m", 1, "active")]
        assert [e.kind for e in db.events()] == ["activated"]
        db.reject("m", 1, FAILED, "x", "d1")
        assert [r.version for r in db.rejected("m")] == [1]
    finally:
        db.close()
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        check.close()
    StateDB(path).close()  # opening again migrates nothing and loses nothing
    again = StateDB(path)
    try:
        assert [r.version for r in again.rejected()] == [1]
    finally:
        again.close()


def test_a_database_from_a_newer_agent_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateDB(path).close()
    newer = sqlite3.connect(path)
    newer.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    newer.commit()
    newer.close()
    with pytest.raises(CacheError, match="newer than this agent"):
        StateDB(path)
