"""model_cache.atomic: writes leave the old or the new content, never a mix; temp files never stay;
renames are made durable in the right order; the cache lock is exclusive and dies with its owner."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from model_cache.atomic import (
    READ_ONLY_DIR,
    READ_ONLY_FILE,
    TEMP_PREFIX,
    atomic_symlink,
    atomic_write_bytes,
    durable_rename,
    ensure_dir,
    lock_exclusive,
    remove_tree,
    temp_name,
)


class Crash(Exception):
    """A failure injected at one step."""


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX))


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Records, in order, each fsync (of which path) and each rename the helpers make."""
    seen: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        seen.append(("fsync", fd_path(fd)))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_write_creates_then_replaces_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"one")
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic_write_bytes(target, b"two, longer", mode=READ_ONLY_FILE)
    assert target.read_bytes() == b"two, longer"
    assert stat.S_IMODE(target.stat().st_mode) == READ_ONLY_FILE
    assert temps(tmp_path) == []


def test_write_flushes_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, steps: list[tuple[str, str]]
) -> None:
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"data")
    kinds = [kind for kind, _ in steps]
    assert kinds == ["fsync", "replace", "fsync"], steps
    temp = steps[1][1].split(" -> ")[0]
    assert Path(temp).parent == tmp_path
    assert Path(temp).name.startswith(TEMP_PREFIX + "state.json-")
    assert steps[0][1] == temp  # the temp file's data, before it takes the name
    assert steps[2][1] == str(tmp_path)  # then the directory entry of the rename


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_content_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"old content")

    def crash(*_args: object) -> None:
        raise Crash(failing)

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(Crash):
        atomic_write_bytes(target, b"new content that never lands")
    monkeypatch.undo()
    assert target.read_bytes() == b"old content"
    assert temps(tmp_path) == []


def test_an_interrupt_mid_write_removes_the_temp_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BaseException (Ctrl-C, SystemExit) cleans up like any error."""
    target = tmp_path / "state.json"

    def interrupt(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"data")
    monkeypatch.undo()
    assert not target.exists()
    assert temps(tmp_path) == []


def test_readers_see_the_old_or_the_new_content_never_a_mix(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    contents = (b"A" * (256 * 1024), b"B" * (300 * 1024))
    atomic_write_bytes(target, contents[0])
    done = threading.Event()
    seen: set[bytes] = set()
    torn: list[int] = []

    def read() -> None:
        while not done.is_set():
            data = target.read_bytes()  # never missing: the rename swaps the name in one step
            if data not in contents:
                torn.append(len(data))
            seen.add(data[:1])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            atomic_write_bytes(target, contents[i % 2])
    finally:
        done.set()
        reader.join(timeout=30)
    assert torn == []
    assert seen <= {b"A", b"B"}
    assert target.read_bytes() == contents[1]
    assert temps(tmp_path) == []


def test_symlink_is_replaced_in_one_step(tmp_path: Path, steps: list[tuple[str, str]]) -> None:
    (tmp_path / "gen-1").mkdir()
    (tmp_path / "gen-2").mkdir()
    link = tmp_path / "repository"
    atomic_symlink("gen-1", link)
    assert os.readlink(link) == "gen-1"
    steps.clear()
    atomic_symlink("gen-2", link)
    assert os.readlink(link) == "gen-2"
    assert link.resolve() == tmp_path / "gen-2"
    assert [kind for kind, _ in steps] == ["replace", "fsync"]
    assert steps[1][1] == str(tmp_path)
    assert temps(tmp_path) == []


def test_symlink_over_a_real_directory_fails_and_leaves_no_temp(tmp_path: Path) -> None:
    (tmp_path / "repository").mkdir()
    (tmp_path / "repository" / "keep").write_text("x")
    with pytest.raises(IsADirectoryError):
        atomic_symlink("gen-1", tmp_path / "repository")
    assert (tmp_path / "repository" / "keep").read_text() == "x"
    assert temps(tmp_path) == []


def test_durable_rename_flushes_both_directories(
    tmp_path: Path, steps: list[tuple[str, str]]
) -> None:
    staging, final = tmp_path / "staging", tmp_path / "versions"
    staging.mkdir()
    final.mkdir()
    (staging / "unit").mkdir()
    (staging / "unit" / "model.onnx").write_bytes(b"weights")
    durable_rename(staging / "unit", final / "unit")
    assert (final / "unit" / "model.onnx").read_bytes() == b"weights"
    assert not (staging / "unit").exists()
    assert steps == [
        ("replace", f"{staging / 'unit'} -> {final / 'unit'}"),
        ("fsync", str(final)),
        ("fsync", str(staging)),
    ]


def test_durable_rename_within_one_directory_flushes_it_once(
    tmp_path: Path, steps: list[tuple[str, str]]
) -> None:
    (tmp_path / "a").write_bytes(b"1")
    durable_rename(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == b"1"
    assert [s for s in steps if s[0] == "fsync"] == [("fsync", str(tmp_path))]


def test_durable_rename_refuses_a_non_empty_destination_and_keeps_both(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("new")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "f").write_text("old")
    with pytest.raises(OSError, match="Directory not empty"):
        durable_rename(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "src" / "f").read_text() == "new"
    assert (tmp_path / "dst" / "f").read_text() == "old"


def test_ensure_dir_flushes_each_parent_it_created_an_entry_in(
    tmp_path: Path, steps: list[tuple[str, str]]
) -> None:
    (tmp_path / "a").mkdir()
    deep = tmp_path / "a" / "b" / "c"
    assert ensure_dir(deep) == deep
    assert deep.is_dir()
    assert steps == [("fsync", str(tmp_path / "a")), ("fsync", str(tmp_path / "a" / "b"))]
    steps.clear()
    ensure_dir(deep)  # already there: nothing to make durable
    assert steps == []


def test_ensure_dir_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        ensure_dir(tmp_path / "file" / "sub")


def test_remove_tree_removes_read_only_trees_and_ignores_missing_paths(tmp_path: Path) -> None:
    tree = tmp_path / "m" / "1"
    tree.mkdir(parents=True)
    (tree / "model.onnx").write_bytes(b"w")
    os.chmod(tree / "model.onnx", READ_ONLY_FILE)
    os.chmod(tree, READ_ONLY_DIR)
    os.chmod(tmp_path / "m", READ_ONLY_DIR)
    assert remove_tree(tmp_path / "m") is True
    assert not (tmp_path / "m").exists()
    assert remove_tree(tmp_path / "m") is False  # idempotent, as recovery needs
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert remove_tree(link) is True
    assert not link.is_symlink()


def test_temp_names_are_unique_and_marked(tmp_path: Path) -> None:
    names = {temp_name("view") for _ in range(1000)}
    assert len(names) == 1000
    assert all(n.startswith(TEMP_PREFIX + "view-") for n in names)
    assert temp_name().startswith(TEMP_PREFIX)
    assert "/" not in temp_name("x")


def test_lock_is_exclusive_between_open_files_and_released_on_close(tmp_path: Path) -> None:
    path = tmp_path / "cache.lock"
    first = lock_exclusive(path)
    assert first != -1
    try:
        assert lock_exclusive(path) == -1  # another open file description: refused, not blocked
    finally:
        os.close(first)
    again = lock_exclusive(path)
    assert again != -1
    os.close(again)


HOLD_LOCK = """
import sys, time
from pathlib import Path
from model_cache.atomic import lock_exclusive
assert lock_exclusive(Path(sys.argv[1])) != -1
print("locked", flush=True)
time.sleep(600)
"""


def run_holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"  # bounded by the test's timeout
    return proc


def test_a_killed_owner_never_blocks_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "cache.lock"
    proc = run_holder(path)
    try:
        assert lock_exclusive(path) == -1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    fd = lock_exclusive(path)
    assert fd != -1
    os.close(fd)
