"""The power-cut file system: a FUSE pass-through to a backing folder that records every
operation into a `Journal`, so that a cut at any durable point can be replayed afterwards.

    python -m tests.powercut.fuse_fs BACKING MOUNTPOINT JOURNAL   # runs until unmounted

The code under test sees an ordinary file system (reads and writes go to BACKING); each
operation that changes something is applied to BACKING and recorded, in order, as an `Op` of
`disk_model`: fsync(2) and fsync of a directory are the durable points. At unmount the journal is
pickled to JOURNAL. `mount.PowerCutMount` starts and stops this process and turns the journal
into the images a power cut would leave.

A workload marks moments (an event it reported as stored, a wave it recorded as done) by
looking up the name `.powercut-mark-LABEL` at the mount's root: the lookup fails (ENOENT) and
LABEL is recorded in the journal, ordered with the file operations around it.

Binding: mfusepy (the maintained fork of fusepy: ctypes over libfuse 3, so no compiler and no
libfuse headers are needed; pyfuse3 needs both, and trio). The file system runs single-threaded
(`-s`) so the journal's order is the order the kernel handed the operations over. Locks
(fcntl, flock) are not implemented here, so the kernel keeps them locally, which is what
SQLite's locking across processes on one host needs.
"""

from __future__ import annotations

import errno
import itertools
import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

import mfusepy

from tests.powercut.disk_model import DiskModel, ModelError, Op
from tests.powercut.mount import MARK_PREFIX

_STAT_KEYS = (
    "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime",
    "st_ino", "st_blocks",
)  # fmt: skip


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


class PowerCutOperations(mfusepy.Operations):  # type: ignore[misc]  # untyped base
    """The FUSE operations: pass through to `backing`, record into `self.ops`."""

    use_ns = True

    def __init__(self, backing: Path) -> None:
        if any(backing.iterdir()):
            raise ValueError(f"{backing} must be empty: the model starts from an empty disk")
        self.backing = backing
        self.model = DiskModel()
        self.ops: list[Op] = []
        self._fh_ino: dict[int, int] = {}
        self._dir_handles = itertools.count(1 << 40)

    def _full(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _record(self, name: str, *args: object) -> None:
        op = Op(name, args)
        self.ops.append(op)
        if name != "mark":
            getattr(self.model, name)(*args)

    def _ino(self, path: str | None, fh: int | None) -> int:
        if fh is not None and fh in self._fh_ino:
            return self._fh_ino[fh]
        if path is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        try:
            return self.model.lookup(_parts(path))
        except ModelError:
            raise mfusepy.FuseOSError(errno.ENOENT) from None

    # -- reading ---------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if name.startswith(MARK_PREFIX) and path.count("/") == 1:
            self._record("mark", name[len(MARK_PREFIX) :])
            raise mfusepy.FuseOSError(errno.ENOENT)
        info = os.fstat(fh) if fh is not None and fh in self._fh_ino else os.lstat(self._full(path))
        found = {key: getattr(info, key) for key in _STAT_KEYS}
        for key in ("st_atime", "st_mtime", "st_ctime"):
            found[key] = getattr(info, key + "_ns")  # `use_ns`
        return found

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *sorted(os.listdir(self._full(path)))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def statfs(self, path: str) -> dict[str, int]:
        info = os.statvfs(self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {key: getattr(info, key) for key in (*keys, "f_flag", "f_frsize", "f_namemax")}

    def opendir(self, path: str) -> int:
        handle = next(self._dir_handles)
        self._fh_ino[handle] = self._ino(path, None)
        return handle

    def releasedir(self, path: str, fh: int) -> int:
        self._fh_ino.pop(fh, None)
        return 0

    # -- files -----------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        fd = os.open(self._full(path), flags & ~os.O_APPEND)  # the kernel passes offsets
        self._fh_ino[fd] = ino = self._ino(path, None)
        if flags & os.O_TRUNC:
            self._record("truncate", ino, 0)
        return fd

    def create(self, path: str, mode: int, flags: int) -> int:
        parts = _parts(path)
        existed = self.model.exists(parts)
        fd = os.open(self._full(path), (flags | os.O_CREAT) & ~os.O_APPEND, mode)
        if not existed:
            self._record("create", parts, stat.S_IMODE(os.fstat(fd).st_mode))
        elif flags & os.O_TRUNC:
            self._record("truncate", self.model.lookup(parts), 0)
        self._fh_ino[fd] = self.model.lookup(parts)
        return fd

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        written = os.pwrite(fh, data, offset)
        self._record("write", self._ino(path, fh), offset, bytes(data[:written]))
        return written

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        ino = self._ino(path, fh)
        if fh is not None and fh in self._fh_ino:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._full(path or "/"), length)
        self._record("truncate", ino, length)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self._record("fsync", self._ino(path, fh))
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self._record("fsync", self._ino(path, fh))
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        self._fh_ino.pop(fh, None)
        os.close(fh)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        raise mfusepy.FuseOSError(errno.EOPNOTSUPP)

    # -- names -----------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        self._record("mkdir", _parts(path), stat.S_IMODE(os.lstat(self._full(path)).st_mode))
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        self._record("rmdir", _parts(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._full(path))
        self._record("unlink", _parts(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._full(old), self._full(new))
        self._record("rename", _parts(old), _parts(new))
        return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy's names: `target` is the new link's path, `source` the text it holds.
        os.symlink(source, self._full(target))
        self._record("symlink", _parts(target), source)
        return 0

    def link(self, target: str, source: str) -> int:
        # `ln source target`: `target` is the new name.
        os.link(self._full(source), self._full(target))
        self._record("link", _parts(source), _parts(target))
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        ino = self._ino(path, None)
        os.chmod(self._full(path or "/"), mode)
        self._record("chmod", ino, stat.S_IMODE(mode))
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._full(path), follow_symlinks=False)
        else:
            os.utime(self._full(path), ns=times, follow_symlinks=False)
        return 0


def serve(backing: Path, mountpoint: Path, journal: Path) -> None:
    """Mount, serve until unmounted, then write the journal (see module docstring)."""
    operations = PowerCutOperations(backing)
    try:
        mfusepy.FUSE(
            operations,
            str(mountpoint),
            foreground=True,
            nothreads=True,
            hard_remove=True,  # an unlinked open file is not renamed to .fuse_hidden*
            fsname="powercut",
        )
    finally:
        tmp = journal.with_name(journal.name + ".tmp")
        tmp.write_bytes(pickle.dumps(operations.ops, protocol=pickle.HIGHEST_PROTOCOL))
        tmp.replace(journal)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
