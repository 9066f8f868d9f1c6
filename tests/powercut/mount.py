"""Mounting the power-cut file system for a test, and what a cut leaves behind.

    with PowerCutMount(tmp_path) as disk:          # FUSE daemon started, disk.path mounted
        run_workload(disk.path)                     # the real code, on the mount
    journal = disk.journal                          # every operation, in order
    for point, image in journal.replay(journal.cut_points()):
        materialize(image, somewhere)               # the disk as a reboot finds it

`cut()` is the live form: kill the processes using the mount (SIGKILL), unmount, and return
the image the durable state leaves. `fuse_unavailable()` says why FUSE cannot be had here, so
tests skip with that reason.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from tests.powercut.disk_model import Image, Journal, Op

MOUNT_TIMEOUT_S = 20.0
#: A lookup of `.powercut-mark-LABEL` at the mount's root records LABEL (see `fuse_fs`).
MARK_PREFIX = ".powercut-mark-"


def fuse_unavailable() -> str | None:
    """Why the power-cut file system cannot be mounted here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 missing (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        return "mfusepy is not installed (pip install -e '.[dev]')"
    except OSError as exc:
        return f"libfuse 3 cannot be loaded (Debian package libfuse3-3): {exc}"
    return None


def mark(mount: Path, label: str) -> None:
    """Record `label` in the mount's journal, ordered with the file operations around it."""
    try:
        os.stat(mount / f"{MARK_PREFIX}{label}")
    except FileNotFoundError:
        return
    raise RuntimeError(f"{mount} is not a power-cut file system")


class PowerCutMount:
    """A mounted power-cut file system over `work/backing` at `work/mnt`.

    Args:
        work: An empty folder for the backing folder, the mount point and the journal.
    """

    def __init__(self, work: Path) -> None:
        self.work = work
        self.backing = work / "backing"
        self.path = work / "mnt"
        self._journal_file = work / "journal.pickle"
        self._daemon: subprocess.Popen[bytes] | None = None
        self._journal: Journal | None = None

    def __enter__(self) -> PowerCutMount:
        self.backing.mkdir(parents=True)
        self.path.mkdir(parents=True)
        log = (self.work / "fuse.log").open("wb")
        self._daemon = subprocess.Popen(
            [sys.executable, "-m", "tests.powercut.fuse_fs", *map(str, self._args())],
            cwd=Path(__file__).resolve().parents[2],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.path):
            if self._daemon.poll() is not None or time.monotonic() > deadline:
                self._stop_daemon()
                text = (self.work / "fuse.log").read_text(errors="replace")
                raise RuntimeError(f"the power-cut file system did not mount: {text[-2000:]}")
            time.sleep(0.02)
        return self

    def _args(self) -> tuple[Path, Path, Path]:
        return self.backing, self.path, self._journal_file

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()

    def unmount(self) -> Journal:
        """Unmount (idempotent) and load the journal."""
        if self._daemon is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)
            try:
                self._daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._stop_daemon()
            self._daemon = None
        if self._journal is None:
            ops: list[Op] = pickle.loads(self._journal_file.read_bytes())
            self._journal = Journal(ops)
        return self._journal

    def _stop_daemon(self) -> None:
        if self._daemon is not None and self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGKILL)
            self._daemon.wait()

    @property
    def journal(self) -> Journal:
        """The operations recorded (after unmounting)."""
        if self._journal is None:
            raise RuntimeError("unmount first")
        return self._journal

    def cut(self, users: Iterable[subprocess.Popen[bytes] | subprocess.Popen[str]] = ()) -> Image:
        """Cut the power now: SIGKILL the processes using the mount, unmount, and return what
        the durable state holds (everything not fsynced is gone)."""
        for proc in users:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        journal = self.unmount()
        last = journal.cut_points()[-1]
        return next(image for _point, image in journal.replay([last]))
