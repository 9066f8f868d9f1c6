"""The power-cut file system under real programs: the kernel's FUSE, real syscalls, SQLite."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.powercut.disk_model import DiskModel, apply
from tests.powercut.image import materialize, same_content, scan
from tests.powercut.mount import PowerCutMount, mark


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_cut_keeps_what_was_fsynced_and_drops_the_rest(powercut: PowerCutMount) -> None:
    disk = powercut.path
    (disk / "kept").write_bytes(b"k" * 10_000)
    _fsync(disk / "kept")
    (disk / "sub").mkdir()
    _fsync(disk)
    (disk / "sub" / "name-not-synced").write_bytes(b"x")
    _fsync(disk / "sub" / "name-not-synced")
    (disk / "kept").write_bytes(b"overwritten")  # O_TRUNC and a write, never synced
    os.symlink("kept", disk / "link")
    image = powercut.cut()
    assert image.files() == {"kept": b"k" * 10_000}
    assert image.paths() == ["kept", "sub"]


def test_the_model_replayed_matches_what_the_kernel_wrote(powercut: PowerCutMount) -> None:
    disk = powercut.path
    (disk / "d" / "e").mkdir(parents=True)
    (disk / "d" / "e" / "f").write_bytes(b"1" * 5000)
    os.link(disk / "d" / "e" / "f", disk / "hard")
    os.rename(disk / "d" / "e", disk / "moved")
    os.chmod(disk / "hard", 0o400)
    with (disk / "appended").open("ab") as handle:
        handle.write(b"a" * 7000)
        handle.write(b"b" * 100)
    os.truncate(disk / "appended", 6000)
    (disk / "gone").write_bytes(b"g")
    os.unlink(disk / "gone")
    journal = powercut.unmount()
    model = DiskModel()
    for op in journal.ops:
        apply(model, op)
    assert same_content(model.live(), scan(powercut.backing)) == []


def test_marks_are_recorded_in_order_with_the_writes(powercut: PowerCutMount) -> None:
    disk = powercut.path
    (disk / "a").write_bytes(b"1")
    mark(disk, "after-a")
    _fsync(disk / "a")
    mark(disk, "after-sync")
    journal = powercut.unmount()
    names = [op.name if op.name != "mark" else op.args[0] for op in journal.ops]
    assert names.index("after-a") < names.index("fsync") < names.index("after-sync")


def _sqlite_commits(disk: Path, synchronous: str) -> None:
    code = (
        "import sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1]); con.execute('PRAGMA journal_mode=WAL')\n"
        f"con.execute('PRAGMA synchronous={synchronous}')\n"
        "con.execute('CREATE TABLE t (x)'); con.commit()\n"
        "for i in range(20): con.execute('INSERT INTO t VALUES (?)', [i]); con.commit()\n"
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n"  # no close, no checkpoint
    )
    subprocess.run([sys.executable, "-c", code, str(disk / "t.db")], check=False)


def _rows_after_cut(powercut: PowerCutMount, tmp_path: Path) -> int:
    image = materialize(powercut.cut(), tmp_path / "image")
    con = sqlite3.connect(image / "t.db")
    try:
        return int(con.execute("SELECT COUNT(*) FROM t").fetchone()[0])
    except sqlite3.OperationalError:
        return -1  # no table: the schema commit was lost too
    finally:
        con.close()


def test_sqlite_wal_with_synchronous_full_keeps_every_commit(
    powercut: PowerCutMount, tmp_path: Path
) -> None:
    _sqlite_commits(powercut.path, "FULL")
    assert _rows_after_cut(powercut, tmp_path) == 20


def test_sqlite_wal_with_synchronous_normal_loses_commits_at_a_cut(
    powercut: PowerCutMount, tmp_path: Path
) -> None:
    # What the fleet stores used before: a kill -9 keeps these commits, a power cut does not.
    _sqlite_commits(powercut.path, "NORMAL")
    assert _rows_after_cut(powercut, tmp_path) < 20
