"""Durable file-system primitives shared by every module of the cache.

A rename is only trusted once what it renames, and the directory it renames into, are on disk.
Every write in `model_cache` goes through the helpers here:

    write temp file in the target directory → fsync(file) → os.replace → fsync(directory)

Invariants:
    * A path written with `atomic_write_bytes` or replaced with `atomic_symlink` holds either its
      old content or its new content after a power cut, never a mix and never nothing (the temp
      name lives in the same directory, so `os.replace` is a single rename(2)).
    * `ensure_dir` makes a new directory's own entry durable by fsyncing each parent it created
      an entry in.
    * `remove_tree` removes read-only trees (the cache makes version folders read-only), and a
      missing path is not an error: removal is used by recovery, which must be idempotent.

Helpers here are public within the package but are not part of `model_cache.__all__`.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import stat
from pathlib import Path

#: Prefix of every temporary name the cache creates; recovery deletes leftovers with it.
TEMP_PREFIX = ".tmp-"

#: Permissions of read-only content: files r--r--r--, directories r-xr-xr-x.
READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555


def temp_name(stem: str = "") -> str:
    """A fresh temporary file name, unique with overwhelming probability.

    Args:
        stem: Text put after the prefix, for people reading a directory listing.

    Returns:
        A name such as `.tmp-repository-3f9a0c...`, without a directory.
    """
    middle = f"{stem}-" if stem else ""
    return f"{TEMP_PREFIX}{middle}{secrets.token_hex(8)}"


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (creations, renames, removals) to disk.

    Args:
        path: An existing directory.

    Raises:
        OSError: The directory cannot be opened or flushed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a regular file's data and metadata to disk (works on read-only files).

    Args:
        path: An existing regular file.

    Raises:
        OSError: The file cannot be opened or flushed.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> Path:
    """Create a directory and any missing parents, durably.

    Args:
        path: The directory to create.

    Raises:
        OSError: A component cannot be created.

    Returns:
        `path`.
    """
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
        fsync_dir(directory.parent)
    return path


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new content.

    Args:
        path: Destination; its directory must exist.
        data: The new content.
        mode: Permissions of the new file (e.g. `READ_ONLY_FILE`).

    Raises:
        OSError: Writing, flushing or renaming failed; the temp file is removed.
    """
    tmp = path.parent / temp_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_symlink(target: str, link: Path) -> None:
    """Point `link` at `target` in one step, replacing whatever `link` was.

    A temp symlink is created next to `link` and renamed over it, so readers see the old target
    or the new one, never a missing link.

    Args:
        target: The symlink's content (relative targets are resolved from `link.parent`).
        link: The symlink to create or replace.

    Raises:
        OSError: Creating or renaming failed; the temp link is removed. Replacing a real
            directory with a symlink fails here (rename(2) refuses), by design.
    """
    tmp = link.parent / temp_name(link.name)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(link.parent)


def durable_rename(source: Path, destination: Path) -> None:
    """Rename `source` to `destination` and flush both directories.

    Args:
        source: An existing file or directory.
        destination: The new name, on the same file system.

    Raises:
        OSError: The rename failed (for directories: e.g. `destination` is a non-empty dir).
    """
    os.replace(source, destination)
    fsync_dir(destination.parent)
    if source.parent != destination.parent:
        fsync_dir(source.parent)


def fsync_tree(root: Path) -> None:
    """Flush every regular file and directory under `root` (bottom-up), then `root` itself.

    Args:
        root: A directory.

    Raises:
        OSError: A file or directory cannot be flushed.
    """
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = Path(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                fsync_file(path)
        fsync_dir(Path(dirpath))


def set_tree_dirs_mode(root: Path, mode: int, *, include_root: bool = True) -> None:
    """Set the permissions of every directory under `root` (files are left alone).

    Args:
        root: A directory.
        mode: E.g. `READ_ONLY_DIR`, or 0o755 to make a tree removable again.
        include_root: Whether `root` itself is changed too.
    """
    for dirpath, dirnames, _filenames in os.walk(root):
        for name in dirnames:
            path = Path(dirpath, name)
            if not path.is_symlink():  # os.walk lists symlinks to directories as directories
                os.chmod(path, mode)
    if include_root:
        os.chmod(root, mode)


def remove_tree(path: Path) -> bool:
    """Remove a file, symlink or directory tree, including read-only directories.

    Args:
        path: What to remove; a missing path is not an error.

    Raises:
        OSError: Something exists but could not be removed.

    Returns:
        True when something was removed.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        set_tree_dirs_mode(path, 0o755)
        shutil.rmtree(path)
    else:
        path.unlink()
    fsync_dir(path.parent)
    return True


def lock_exclusive(path: Path) -> int:
    """Take an exclusive, non-blocking flock(2) on `path` (created if missing).

    The lock dies with the process (even on SIGKILL), so a crashed owner never blocks a restart.

    Args:
        path: The lock file.

    Raises:
        OSError: The file cannot be opened.

    Returns:
        The open descriptor holding the lock (close it to release), or -1 when another open
        file description holds the lock.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    return fd
