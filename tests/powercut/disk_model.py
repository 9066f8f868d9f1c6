"""A pure model of what a disk keeps at a power cut: volatile state versus durable state.

    disk = DiskModel()
    ino = disk.create(("state.db",), mode=0o644)
    disk.write(ino, 0, b"hello")              # volatile: lost at a cut
    disk.fsync(ino)                            # the data is durable, the name is not yet
    disk.fsync(disk.lookup(()))                # now the name is durable too
    image = disk.cut()                         # what a reboot finds: {"state.db": b"hello"}

The rules are POSIX's strict reading, as crash-consistency checkers use them (CrashMonkey,
dm-log-writes replays):

    * A file's data, size and mode become durable only when the file is fsynced.
    * A directory's entries (create, link, unlink, mkdir, rmdir, symlink, rename) become durable
      only when that directory is fsynced. A rename is one operation: it becomes durable, on both
      sides, when either directory is fsynced (journaling file systems commit it whole; a
      directory never appears under two names).
    * A new inode's type and initial mode come with its entry; a symlink's target is written with
      it (symlinks are immutable).
    * At a cut, a file reached through durable entries holds its durable data, or nothing when it
      was never fsynced.

Tearing (`cut(rng=...)`) also keeps a random part of what was not made durable, as a disk
writing back its cache does: each 4 KiB block of each pending write independently, each pending
truncate or mode change as a unit, and a random prefix of the pending directory operations (a
journal commits in order). Every such outcome is one a real disk may produce.

Nothing here touches a file system: `image.py` writes an `Image` to a folder, `fuse_fs.py` feeds
the model from a FUSE file system. `Journal` records the operations so any cut point can be
replayed later.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

BLOCK_BYTES = 4096

Path = tuple[str, ...]  # components below the root; () is the root


class ModelError(Exception):
    """An operation the file system would have refused (the FUSE layer checks first)."""


@dataclass(slots=True)
class _Inode:
    kind: str  # "file", "dir", "symlink"
    mode: int
    durable_mode: int
    data: bytearray = field(default_factory=bytearray)
    durable_data: bytes | None = None  # None: never fsynced
    pending: list[tuple[str, int, bytes | int]] = field(default_factory=list)
    entries: dict[str, int] = field(default_factory=dict)  # directories: the live entries
    durable_entries: dict[str, int] = field(default_factory=dict)
    target: str = ""  # symlinks


@dataclass(frozen=True, slots=True)
class _EntryOp:
    """One directory operation: each (directory inode, name, inode or None) change, in order."""

    changes: tuple[tuple[int, str, int | None], ...]

    @property
    def dirs(self) -> frozenset[int]:
        return frozenset(d for d, _n, _i in self.changes)


@dataclass(frozen=True, slots=True)
class ImageFile:
    """A regular file in an image; `ino` groups hard links to the same inode."""

    ino: int
    data: bytes
    mode: int


@dataclass(frozen=True, slots=True)
class ImageDir:
    """A directory in an image."""

    mode: int


@dataclass(frozen=True, slots=True)
class ImageLink:
    """A symlink in an image."""

    target: str


ImageEntry = ImageFile | ImageDir | ImageLink


@dataclass(frozen=True, slots=True)
class Image:
    """What a disk holds: every path below the root (sorted, parents first) and its entry."""

    entries: tuple[tuple[Path, ImageEntry], ...]

    def files(self) -> dict[str, bytes]:
        """path ("a/b") → content of every regular file (for tests)."""
        return {"/".join(p): e.data for p, e in self.entries if isinstance(e, ImageFile)}

    def paths(self) -> list[str]:
        """Every path, "a/b" style, sorted."""
        return sorted("/".join(p) for p, _e in self.entries)


class DiskModel:
    """One file system's live and durable state (see module docstring).

    Starts as an empty, durable root directory of mode 0o755.
    """

    ROOT = 1

    def __init__(self) -> None:
        self._inodes: dict[int, _Inode] = {self.ROOT: _Inode("dir", 0o755, 0o755)}
        self._next = self.ROOT + 1
        self._pending_entries: list[_EntryOp] = []

    # -- lookups -----------------------------------------------------------------------------

    def lookup(self, path: Path) -> int:
        """The inode a live path names (symlinks are not followed).

        Raises:
            ModelError: No such path.
        """
        ino = self.ROOT
        for name in path:
            node = self._inodes[ino]
            if node.kind != "dir" or name not in node.entries:
                raise ModelError(f"no such path: /{'/'.join(path)}")
            ino = node.entries[name]
        return ino

    def exists(self, path: Path) -> bool:
        """Whether a live path exists."""
        try:
            self.lookup(path)
        except ModelError:
            return False
        return True

    def kind(self, ino: int) -> str:
        """The inode's kind: "file", "dir" or "symlink"."""
        return self._inodes[ino].kind

    def pending_count(self) -> int:
        """Operations not yet durable (data writes, truncates, mode changes, entry changes)."""
        data = sum(len(n.pending) for n in self._inodes.values())
        return data + len(self._pending_entries)

    # -- directory operations ----------------------------------------------------------------

    def _parent(self, path: Path) -> tuple[int, str]:
        if not path:
            raise ModelError("the root has no parent")
        parent = self.lookup(path[:-1])
        if self._inodes[parent].kind != "dir":
            raise ModelError(f"not a directory: /{'/'.join(path[:-1])}")
        return parent, path[-1]

    def _new(self, kind: str, mode: int) -> int:
        ino = self._next
        self._next += 1
        self._inodes[ino] = _Inode(kind, mode, mode)
        return ino

    def _apply_live(self, op: _EntryOp) -> None:
        for directory, name, ino in op.changes:
            entries = self._inodes[directory].entries
            if ino is None:
                entries.pop(name, None)
            else:
                entries[name] = ino
        self._pending_entries.append(op)

    def _add(self, path: Path, kind: str, mode: int) -> int:
        parent, name = self._parent(path)
        if name in self._inodes[parent].entries:
            raise ModelError(f"exists: /{'/'.join(path)}")
        ino = self._new(kind, mode)
        self._apply_live(_EntryOp(((parent, name, ino),)))
        return ino

    def create(self, path: Path, mode: int) -> int:
        """A new, empty regular file. Returns its inode."""
        return self._add(path, "file", mode)

    def mkdir(self, path: Path, mode: int) -> int:
        """A new, empty directory. Returns its inode."""
        return self._add(path, "dir", mode)

    def symlink(self, path: Path, target: str) -> int:
        """A new symlink holding `target`. Returns its inode."""
        ino = self._add(path, "symlink", 0o777)
        self._inodes[ino].target = target
        return ino

    def link(self, existing: Path, new: Path) -> None:
        """A second name for a file."""
        ino = self.lookup(existing)
        parent, name = self._parent(new)
        if name in self._inodes[parent].entries:
            raise ModelError(f"exists: /{'/'.join(new)}")
        self._apply_live(_EntryOp(((parent, name, ino),)))

    def unlink(self, path: Path) -> None:
        """Remove a name of a file or symlink."""
        parent, name = self._parent(path)
        if self.kind(self.lookup(path)) == "dir":
            raise ModelError(f"is a directory: /{'/'.join(path)}")
        self._apply_live(_EntryOp(((parent, name, None),)))

    def rmdir(self, path: Path) -> None:
        """Remove an empty directory."""
        parent, name = self._parent(path)
        node = self._inodes[self.lookup(path)]
        if node.kind != "dir" or node.entries:
            raise ModelError(f"not an empty directory: /{'/'.join(path)}")
        self._apply_live(_EntryOp(((parent, name, None),)))

    def rename(self, source: Path, destination: Path) -> None:
        """rename(2): replaces the destination (an empty directory, or a non-directory)."""
        ino = self.lookup(source)
        src_parent, src_name = self._parent(source)
        dst_parent, dst_name = self._parent(destination)
        if source == destination:
            return
        replaced = self._inodes[dst_parent].entries.get(dst_name)
        if replaced is not None and self.kind(replaced) == "dir" and self._inodes[replaced].entries:
            raise ModelError(f"not empty: /{'/'.join(destination)}")
        self._apply_live(_EntryOp(((src_parent, src_name, None), (dst_parent, dst_name, ino))))

    # -- data operations ---------------------------------------------------------------------

    def write(self, ino: int, offset: int, data: bytes) -> None:
        """pwrite(2) into a regular file."""
        node = self._file(ino)
        _splice(node.data, offset, data)
        node.pending.append(("write", offset, bytes(data)))

    def truncate(self, ino: int, size: int) -> None:
        """ftruncate(2) of a regular file."""
        node = self._file(ino)
        _resize(node.data, size)
        node.pending.append(("truncate", size, 0))

    def chmod(self, ino: int, mode: int) -> None:
        """chmod(2): the permission bits, durable at the inode's next fsync."""
        node = self._inodes[ino]
        node.mode = mode & 0o7777
        node.pending.append(("chmod", node.mode, 0))

    def fsync(self, ino: int) -> None:
        """fsync(2): a file's data and mode, or a directory's entries and mode, become durable."""
        node = self._inodes[ino]
        node.durable_mode = node.mode
        if node.kind == "file":
            node.durable_data = bytes(node.data)
            node.pending.clear()
            return
        node.pending.clear()
        if node.kind != "dir":
            return
        # The ops touching this directory, and every earlier op touching a directory one of
        # them touches (a rename out of `staging/` must not be committed before the mkdir that
        # made what it moves): each directory's own history is committed in order.
        need = {ino}
        chosen: list[bool] = []
        for op in reversed(self._pending_entries):
            picked = bool(op.dirs & need)
            if picked:
                need |= op.dirs
            chosen.append(picked)
        chosen.reverse()
        for op, picked in zip(self._pending_entries, chosen, strict=True):
            if picked:
                self._commit(op)
        self._pending_entries = [
            op for op, picked in zip(self._pending_entries, chosen, strict=True) if not picked
        ]

    def _commit(self, op: _EntryOp) -> None:
        for directory, name, target in op.changes:
            entries = self._inodes[directory].durable_entries
            if target is None:
                entries.pop(name, None)
            else:
                entries[name] = target

    def _file(self, ino: int) -> _Inode:
        node = self._inodes[ino]
        if node.kind != "file":
            raise ModelError(f"inode {ino} is not a regular file")
        return node

    # -- images ------------------------------------------------------------------------------

    def live(self) -> Image:
        """What the file system holds now (before any cut)."""
        nodes = self._inodes
        return self._image(
            lambda ino: nodes[ino].entries,
            lambda ino: bytes(nodes[ino].data),
            lambda ino: nodes[ino].mode,
        )

    def cut(self, rng: random.Random | None = None) -> Image:
        """What a reboot finds after the power is cut now.

        Args:
            rng: None drops everything not durable; a generator tears it (module docstring).

        Returns:
            The durable image (the model itself is unchanged).
        """
        nodes = self._inodes
        if rng is None:
            return self._image(
                lambda ino: nodes[ino].durable_entries,
                lambda ino: nodes[ino].durable_data or b"",
                lambda ino: nodes[ino].durable_mode,
            )
        entries = {i: dict(n.durable_entries) for i, n in nodes.items() if n.kind == "dir"}
        keep = rng.randint(0, len(self._pending_entries))
        for op in self._pending_entries[:keep]:
            for directory, name, target in op.changes:
                if target is None:
                    entries[directory].pop(name, None)
                else:
                    entries[directory][name] = target
        torn = {ino: _torn(node, rng) for ino, node in nodes.items()}
        return self._image(
            lambda ino: entries[ino], lambda ino: torn[ino][0], lambda ino: torn[ino][1]
        )

    def _image(
        self,
        entries_of: Callable[[int], Mapping[str, int]],
        data_of: Callable[[int], bytes],
        mode_of: Callable[[int], int],
    ) -> Image:
        seen_dirs = {self.ROOT}

        def walk(ino: int, path: Path) -> Iterator[tuple[Path, ImageEntry]]:
            entries = entries_of(ino)
            for name in sorted(entries):
                child_ino = entries[name]
                child = self._inodes[child_ino]
                child_path = (*path, name)
                if child.kind == "file":
                    yield child_path, ImageFile(child_ino, data_of(child_ino), mode_of(child_ino))
                elif child.kind == "symlink":
                    yield child_path, ImageLink(child.target)
                elif child_ino not in seen_dirs:  # a directory has one name (see `rename`)
                    seen_dirs.add(child_ino)
                    yield child_path, ImageDir(mode_of(child_ino))
                    yield from walk(child_ino, child_path)

        return Image(tuple(walk(self.ROOT, ())))


def _splice(buffer: bytearray, offset: int, data: bytes) -> None:
    if offset > len(buffer):
        buffer.extend(bytes(offset - len(buffer)))
    buffer[offset : offset + len(data)] = data


def _resize(buffer: bytearray, size: int) -> None:
    if size < len(buffer):
        del buffer[size:]
    else:
        buffer.extend(bytes(size - len(buffer)))


def _torn(node: _Inode, rng: random.Random) -> tuple[bytes, int]:
    """A file's content and mode after a cut that wrote back part of its pending operations."""
    content = bytearray(node.durable_data or b"")
    mode = node.durable_mode
    for kind, offset, payload in node.pending:
        if kind == "chmod":
            if rng.random() < 0.5:
                mode = offset
        elif kind == "truncate":
            if rng.random() < 0.5:
                _resize(content, offset)
        else:
            assert isinstance(payload, bytes)
            for start, piece in _blocks(offset, payload):
                if rng.random() < 0.5:
                    _splice(content, start, piece)
    return bytes(content), mode


def _blocks(offset: int, data: bytes) -> Iterator[tuple[int, bytes]]:
    """A write split at 4 KiB block boundaries of the file."""
    position = 0
    while position < len(data):
        start = offset + position
        room = BLOCK_BYTES - start % BLOCK_BYTES
        yield start, data[position : position + room]
        position += room


# -- journal: operations recorded by the FUSE layer, replayed to any cut point ---------------


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation. `name` is the model method; `args` its arguments. A `mark` op
    carries a label the workload sent (ordered with the file operations), and changes nothing."""

    name: str
    args: tuple[object, ...]

    @property
    def durable(self) -> bool:
        """Whether this op is a durable point (an fsync)."""
        return self.name == "fsync"


def apply(model: DiskModel, op: Op) -> None:
    """Apply one recorded operation to a model."""
    if op.name == "mark":
        return
    getattr(model, op.name)(*op.args)


@dataclass(frozen=True, slots=True)
class CutPoint:
    """A moment to cut the power: after op `index` (the `k`-th durable point, counted from 1;
    0: before any). `marks` are the workload's labels sent before the cut."""

    k: int
    index: int
    marks: tuple[str, ...]


class Journal:
    """The operations of one run, in order, and their durable points."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self.ops = tuple(ops)
        self.durable_indices = tuple(i for i, op in enumerate(self.ops) if op.durable)

    def cut_points(self) -> list[CutPoint]:
        """One cut per durable point, taken just before the next durable op: everything the
        run did up to then was done, and only what the k-th fsync made durable survives (plus
        what tearing keeps). Marks sent in that window count as reported."""
        points: list[CutPoint] = []
        bounds = [*self.durable_indices, len(self.ops)]
        marks: list[str] = []
        start = 0
        for k, end in enumerate(bounds):
            marks.extend(str(op.args[0]) for op in self.ops[start:end] if op.name == "mark")
            points.append(CutPoint(k, end - 1, tuple(marks)))
            start = end
        return points

    def replay(
        self, points: Sequence[CutPoint], rng: random.Random | None = None, variants: int = 1
    ) -> Iterator[tuple[CutPoint, Image]]:
        """The image at each cut point (in index order), replaying the journal once.

        Args:
            points: Where to cut.
            rng: None: drop what is not durable; else tear it, `variants` images per point.
            variants: Images per point when tearing.
        """
        model = DiskModel()
        position = 0
        for point in sorted(points, key=lambda p: p.index):
            while position <= point.index:
                apply(model, self.ops[position])
                position += 1
            for _ in range(variants if rng is not None else 1):
                yield point, model.cut(rng)
