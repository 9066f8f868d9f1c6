"""The power-cut model on its own: what survives a cut, with no FUSE and no disk."""

from __future__ import annotations

import random

from tests.powercut.disk_model import BLOCK_BYTES, DiskModel, Journal, Op, apply


def _file(disk: DiskModel, path: tuple[str, ...], data: bytes) -> int:
    ino = disk.create(path, 0o644)
    disk.write(ino, 0, data)
    return ino


def test_nothing_survives_that_was_not_fsynced() -> None:
    disk = DiskModel()
    _file(disk, ("a",), b"hello")
    assert disk.live().files() == {"a": b"hello"}
    assert disk.cut().files() == {}


def test_a_synced_file_needs_its_directory_synced_too() -> None:
    disk = DiskModel()
    ino = _file(disk, ("a",), b"hello")
    disk.fsync(ino)
    assert disk.cut().files() == {}  # the name was never made durable
    disk.fsync(DiskModel.ROOT)
    assert disk.cut().files() == {"a": b"hello"}


def test_a_name_made_durable_before_its_data_is_an_empty_file() -> None:
    disk = DiskModel()
    _file(disk, ("a",), b"hello")
    disk.fsync(DiskModel.ROOT)
    assert disk.cut().files() == {"a": b""}


def test_writes_after_the_fsync_are_lost_and_the_synced_content_kept() -> None:
    disk = DiskModel()
    ino = _file(disk, ("a",), b"old")
    disk.fsync(ino)
    disk.fsync(DiskModel.ROOT)
    disk.write(ino, 0, b"new!")
    disk.truncate(ino, 2)
    assert disk.live().files() == {"a": b"ne"}
    assert disk.cut().files() == {"a": b"old"}


def test_the_atomic_replace_pattern_gives_old_or_new() -> None:
    disk = DiskModel()
    old = _file(disk, ("f",), b"old")
    disk.fsync(old)
    disk.fsync(DiskModel.ROOT)
    new = _file(disk, ("f.tmp",), b"new")
    assert disk.cut().files() == {"f": b"old"}  # before the rename is durable
    disk.rename(("f.tmp",), ("f",))
    assert disk.cut().files() == {"f": b"old"}
    disk.fsync(new)  # data first, then the directory that holds the new name
    disk.fsync(DiskModel.ROOT)
    assert disk.cut().files() == {"f": b"new"}


def test_a_rename_without_fsyncing_the_file_can_leave_it_empty() -> None:
    disk = DiskModel()
    _file(disk, ("f.tmp",), b"new")
    disk.rename(("f.tmp",), ("f",))
    disk.fsync(DiskModel.ROOT)
    assert disk.cut().files() == {"f": b""}  # the bug python-tuf's unsynced writes risk


def test_a_rename_across_directories_is_durable_whole_when_either_side_is_synced() -> None:
    disk = DiskModel()
    for name in ("src", "dst"):
        disk.mkdir((name,), 0o755)
    disk.fsync(DiskModel.ROOT)
    ino = _file(disk, ("src", "x"), b"x")
    disk.fsync(ino)
    disk.fsync(disk.lookup(("src",)))
    disk.rename(("src", "x"), ("dst", "x"))
    disk.fsync(disk.lookup(("dst",)))
    assert disk.cut().files() == {"dst/x": b"x"}


def test_each_directory_commits_its_history_in_order() -> None:
    # mkdir staging/X, rename it to versions/X, fsync versions then staging: X must not come
    # back in staging (the mkdir is older than the rename that moved X out).
    disk = DiskModel()
    for name in ("staging", "versions"):
        disk.mkdir((name,), 0o755)
    disk.fsync(DiskModel.ROOT)
    disk.mkdir(("staging", "X"), 0o755)
    disk.fsync(disk.lookup(("staging", "X")))
    disk.rename(("staging", "X"), ("versions", "X"))
    disk.fsync(disk.lookup(("versions",)))
    disk.fsync(disk.lookup(("staging",)))
    assert disk.cut().paths() == ["staging", "versions", "versions/X"]


def test_hard_links_share_one_inode_and_unlink_is_durable_with_the_directory() -> None:
    disk = DiskModel()
    ino = _file(disk, ("blob",), b"b")
    disk.fsync(ino)
    disk.link(("blob",), ("copy",))
    disk.fsync(DiskModel.ROOT)
    image = disk.cut()
    assert image.files() == {"blob": b"b", "copy": b"b"}
    assert len({e.ino for _p, e in image.entries if hasattr(e, "ino")}) == 1
    disk.unlink(("blob",))
    assert disk.cut().files() == {"blob": b"b", "copy": b"b"}
    disk.fsync(DiskModel.ROOT)
    assert disk.cut().files() == {"copy": b"b"}


def test_a_mode_change_is_durable_at_the_inodes_fsync() -> None:
    disk = DiskModel()
    ino = _file(disk, ("f",), b"")
    disk.fsync(ino)
    disk.fsync(DiskModel.ROOT)
    disk.chmod(ino, 0o444)
    assert [getattr(e, "mode", None) for _p, e in disk.cut().entries] == [0o644]
    disk.fsync(ino)
    assert [getattr(e, "mode", None) for _p, e in disk.cut().entries] == [0o444]


def test_tearing_keeps_whole_blocks_of_the_pending_writes() -> None:
    disk = DiskModel()
    ino = _file(disk, ("f",), b"\x00" * (4 * BLOCK_BYTES))
    disk.fsync(ino)
    disk.fsync(DiskModel.ROOT)
    disk.write(ino, 0, b"\xff" * (4 * BLOCK_BYTES))
    outcomes = set()
    rng = random.Random(7)
    for _ in range(64):
        data = disk.cut(rng).files()["f"]
        blocks = [data[i : i + BLOCK_BYTES] for i in range(0, len(data), BLOCK_BYTES)]
        assert all(b in (b"\x00" * BLOCK_BYTES, b"\xff" * BLOCK_BYTES) for b in blocks)
        outcomes.add(tuple(b[0] for b in blocks))
    assert len(outcomes) > 8  # blocks are kept independently: a torn write


def test_tearing_keeps_a_prefix_of_the_pending_directory_operations() -> None:
    disk = DiskModel()
    for name in "abc":
        disk.fsync(_file(disk, (name,), name.encode()))
    seen = {tuple(disk.cut(random.Random(seed)).paths()) for seed in range(40)}
    assert seen == {(), ("a",), ("a", "b"), ("a", "b", "c")}


def test_the_journal_cuts_at_each_durable_point_with_the_marks_sent_before_it() -> None:
    ops = [
        Op("create", (("f",), 0o644)),
        Op("write", (2, 0, b"1")),
        Op("fsync", (2,)),
        Op("fsync", (1,)),
        Op("mark", ("one",)),
        Op("write", (2, 0, b"2")),
        Op("fsync", (2,)),
        Op("mark", ("two",)),
    ]
    journal = Journal(ops)
    points = journal.cut_points()
    assert [(p.k, p.index, p.marks) for p in points] == [
        (0, 1, ()),
        (1, 2, ()),
        (2, 5, ("one",)),
        (3, 7, ("one", "two")),
    ]
    images = [image.files() for _p, image in journal.replay(points)]
    assert images == [{}, {}, {"f": b"1"}, {"f": b"2"}]
    model = DiskModel()
    for op in ops:
        apply(model, op)
    assert model.live().files() == {"f": b"2"}
