"""The SQLite state database: WAL, transactions, the state machine, events."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_cache import (
    CacheError,
    InvalidVersionError,
    StateDB,
    VersionNotFoundError,
    VersionState,
)
from model_cache.records import FileRecord
from tests.fakes import FakeClock

D1 = hashlib.sha256(b"manifest 1").hexdigest()
D2 = hashlib.sha256(b"manifest 2").hexdigest()
BLOB_A = hashlib.sha256(b"a").hexdigest()
BLOB_B = hashlib.sha256(b"b").hexdigest()
FILES = [FileRecord("config.pbtxt", BLOB_A, 1), FileRecord("1/model.onnx", BLOB_B, 1)]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(db_path: Path, clock: FakeClock) -> Iterator[StateDB]:
    state = StateDB(db_path, clock=clock)
    yield state
    state.close()


def ready(db: StateDB, model: str, version: int, digest: str = D1) -> None:
    db.record_staged(model, version, digest, FILES)
    db.set_state(model, version, VersionState.READY)


def test_database_uses_wal(db: StateDB, db_path: Path) -> None:
    assert db.journal_mode == "wal"
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


def test_record_staged_stores_version_files_and_event(db: StateDB, clock: FakeClock) -> None:
    record = db.record_staged("m", 1, D1, FILES)

    assert record.state is VersionState.STAGED
    assert record.digest == D1
    assert record.created_at == record.last_used
    assert record.activated_at is None
    assert db.files("m", 1) == sorted(FILES, key=lambda f: f.path)
    [event] = db.events()
    assert (event.kind, event.model, event.version) == ("staged", "m", 1)
    assert event.detail == {"digest": D1, "files": 2}
    assert event.time <= clock.now


def test_lifecycle_staged_ready_active_retired(db: StateDB) -> None:
    ready(db, "m", 1)
    ready(db, "m", 2, D2)

    assert db.activate("m", 1) is None
    previous = db.activate("m", 2)

    assert previous is not None
    assert previous.version == 1
    assert db.require("m", 1).state is VersionState.RETIRED
    assert db.require("m", 2).state is VersionState.ACTIVE
    assert db.active_version("m") == db.require("m", 2)
    kinds = [e.kind for e in db.events()]
    assert kinds == ["staged", "ready", "staged", "ready", "activated", "activated"]
    assert db.events()[-1].detail["previous"] == 1


def test_activation_times_come_from_the_clock(db: StateDB, clock: FakeClock) -> None:
    ready(db, "m", 1)
    clock.now = 5_000.0

    db.activate("m", 1)

    record = db.require("m", 1)
    assert record.activated_at == 5_001.0
    assert record.last_used == 5_001.0


def test_only_one_active_version_per_model(db: StateDB) -> None:
    for version, digest in [(1, D1), (2, D2)]:
        ready(db, "m", version, digest)
        db.activate("m", version)
    ready(db, "other", 1)
    db.activate("other", 1)

    active = db.versions(states=[VersionState.ACTIVE])

    assert [(r.model, r.version) for r in active] == [("m", 2), ("other", 1)]


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (VersionState.STAGED, VersionState.RETIRED),
        (VersionState.STAGED, VersionState.ACTIVE),
        (VersionState.READY, VersionState.STAGED),
        (VersionState.FAILED, VersionState.READY),
    ],
)
def test_forbidden_moves_raise(db: StateDB, start: VersionState, target: VersionState) -> None:
    db.record_staged("m", 1, D1, FILES)
    if start is not VersionState.STAGED:
        db.set_state("m", 1, start, "because")

    with pytest.raises(InvalidVersionError):
        db.set_state("m", 1, target)
    assert db.require("m", 1).state is start


def test_failed_versions_cannot_be_activated(db: StateDB) -> None:
    db.record_staged("m", 1, D1, FILES)
    db.set_state("m", 1, VersionState.FAILED, "broken")

    with pytest.raises(InvalidVersionError):
        db.activate("m", 1)


def test_failed_keeps_its_reason_in_row_and_event(db: StateDB) -> None:
    ready(db, "m", 1)

    db.set_state("m", 1, VersionState.FAILED, "digest mismatch")

    assert db.require("m", 1).reason == "digest mismatch"
    assert db.events()[-1].detail["reason"] == "digest mismatch"


def test_record_staged_refuses_an_existing_version(db: StateDB) -> None:
    ready(db, "m", 1)

    with pytest.raises(InvalidVersionError):
        db.record_staged("m", 1, D2, FILES)
    assert db.require("m", 1).digest == D1


def test_record_staged_replaces_a_failed_version(db: StateDB) -> None:
    db.record_staged("m", 1, D1, FILES)
    db.set_state("m", 1, VersionState.FAILED, "interrupted")

    record = db.record_staged("m", 1, D2, FILES[:1])

    assert record.digest == D2
    assert record.reason is None
    assert db.files("m", 1) == FILES[:1]


def test_a_failing_transaction_leaves_nothing_behind(db: StateDB) -> None:
    duplicate = [FILES[0], FILES[0]]

    with pytest.raises(CacheError):
        db.record_staged("m", 1, D1, duplicate)

    assert db.get("m", 1) is None
    assert db.files("m", 1) == []
    assert db.events() == []


def test_unknown_versions(db: StateDB) -> None:
    assert db.get("m", 1) is None
    with pytest.raises(VersionNotFoundError):
        db.require("m", 1)
    with pytest.raises(VersionNotFoundError):
        db.set_state("m", 1, VersionState.READY)


def test_delete_version_removes_rows_and_logs(db: StateDB) -> None:
    ready(db, "m", 1)

    db.delete_version("m", 1, detail={"reason": "old"})

    assert db.get("m", 1) is None
    assert db.files("m", 1) == []
    event = db.events()[-1]
    assert event.kind == "evicted"
    assert event.detail["reason"] == "old"
    assert event.detail["state"] == "ready"


def test_delete_version_refuses_the_active_one(db: StateDB) -> None:
    ready(db, "m", 1)
    db.activate("m", 1)

    with pytest.raises(InvalidVersionError):
        db.delete_version("m", 1, detail={})
    assert db.require("m", 1).state is VersionState.ACTIVE


def test_referenced_digests_skip_failed_versions(db: StateDB) -> None:
    ready(db, "m", 1)
    db.record_staged("m", 2, D2, [FileRecord("2/model.onnx", BLOB_B, 1)])
    assert db.referenced_digests() == {BLOB_A, BLOB_B}

    db.set_state("m", 1, VersionState.FAILED, "bad")

    assert db.referenced_digests() == {BLOB_B}


def test_touch_updates_last_used(db: StateDB, clock: FakeClock) -> None:
    ready(db, "m", 1)
    clock.now = 9_000.0

    db.touch("m", 1)

    assert db.require("m", 1).last_used == 9_001.0


def test_events_page_by_id(db: StateDB) -> None:
    for n in range(5):
        db.add_event("note", detail={"n": n})

    first = db.events(limit=2)
    rest = db.events(since_id=first[-1].id)

    assert [e.detail["n"] for e in first] == [0, 1]
    assert [e.detail["n"] for e in rest] == [2, 3, 4]
    assert [e.id for e in first + rest] == sorted(e.id for e in first + rest)


def test_state_survives_reopening(db_path: Path, clock: FakeClock) -> None:
    first = StateDB(db_path, clock=clock)
    ready(first, "m", 1)
    first.activate("m", 1)
    first.close()

    second = StateDB(db_path, clock=clock)
    try:
        assert second.require("m", 1).state is VersionState.ACTIVE
        assert len(second.events()) == 3
        assert second.journal_mode == "wal"
    finally:
        second.close()


def test_versions_filters_by_model_and_state(db: StateDB) -> None:
    ready(db, "a", 1)
    ready(db, "a", 2, D2)
    ready(db, "b", 1)
    db.activate("a", 2)

    assert [(r.model, r.version) for r in db.versions()] == [("a", 1), ("a", 2), ("b", 1)]
    assert [r.version for r in db.versions("a")] == [1, 2]
    ready_only = db.versions(states=[VersionState.READY])
    assert [(r.model, r.version) for r in ready_only] == [("a", 1), ("b", 1)]


def test_not_a_database_is_a_cache_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(CacheError):
        StateDB(path)
