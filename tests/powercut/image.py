"""Images on real folders: write what a cut left (`materialize`), read what a folder holds
(`scan`, to check the model against the FUSE layer's backing folder).

A materialized image is a plain folder: the reboot that follows a cut runs the real code on it,
like a board that boots on the same disk after the power came back.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.powercut.disk_model import Image, ImageDir, ImageEntry, ImageFile, ImageLink


def materialize(image: Image, root: Path) -> Path:
    """Write `image` into the empty or missing folder `root` (hard links kept as hard links).

    Returns:
        `root`.
    """
    root.mkdir(parents=True, exist_ok=True)
    first_path: dict[int, Path] = {}
    dir_modes: list[tuple[Path, int]] = []
    for parts, entry in image.entries:
        path = root.joinpath(*parts)
        if isinstance(entry, ImageDir):
            path.mkdir()
            dir_modes.append((path, entry.mode))
        elif isinstance(entry, ImageLink):
            os.symlink(entry.target, path)
        elif entry.ino in first_path:
            os.link(first_path[entry.ino], path)
        else:
            path.write_bytes(entry.data)
            os.chmod(path, entry.mode)
            first_path[entry.ino] = path
    for path, mode in reversed(dir_modes):  # children first: a read-only parent stays writable
        os.chmod(path, mode)
    return root


def scan(root: Path) -> dict[str, ImageEntry]:
    """What a folder holds: "a/b" → entry (inode numbers are the folder's own)."""
    found: dict[str, ImageEntry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath, name)
            info = os.lstat(path)
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ImageLink(os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ImageDir(stat.S_IMODE(info.st_mode))
            else:
                found[rel] = ImageFile(info.st_ino, path.read_bytes(), stat.S_IMODE(info.st_mode))
    return found


def same_content(image: Image, folder: dict[str, ImageEntry]) -> list[str]:
    """Differences between an image and a scanned folder (paths, kinds, bytes, modes).

    Returns:
        One line per difference; empty when they agree.
    """
    ours = {"/".join(p): e for p, e in image.entries}
    problems = [f"only in the model: {p}" for p in sorted(ours.keys() - folder.keys())]
    problems += [f"only on disk: {p}" for p in sorted(folder.keys() - ours.keys())]
    for path in sorted(ours.keys() & folder.keys()):
        a, b = ours[path], folder[path]
        if type(a) is not type(b):
            problems.append(f"{path}: {type(a).__name__} in the model, {type(b).__name__} on disk")
        elif isinstance(a, ImageFile) and isinstance(b, ImageFile):
            if a.data != b.data:
                problems.append(f"{path}: {len(a.data)} bytes in the model, {len(b.data)} on disk")
            elif a.mode != b.mode:
                problems.append(f"{path}: mode {a.mode:o} in the model, {b.mode:o} on disk")
        elif a != b:
            problems.append(f"{path}: {a} in the model, {b} on disk")
    return problems
