"""Version manifests, and the rules a source folder must meet to become a version.

A source folder is a Triton model folder; installing version V of it takes::

    SOURCE/config.pbtxt          required, a regular file
    SOURCE/V/…                   required, the version folder (other version folders are ignored)

The manifest (`manifest.json` at the top of an installed version) lists every file with its
SHA-256 and size, and every directory, in canonical JSON (sorted keys, no spaces). The SHA-256 of
those bytes is the version's digest: it names the version folder (`V-DIGEST12`) and is stored in
the state database, so a manifest cannot be altered without the change being detected.

Invariants:
    * A manifest only holds validated relative paths under `config.pbtxt` or `V/`.
    * `Manifest.from_bytes(m.to_bytes()) == m`, and `to_bytes` is deterministic, so the same
      content installed twice gets the same digest (installs are idempotent).
    * A source is refused, not partly installed: symlinks, devices, sockets, a missing config or
      a missing model file raise `InvalidVersionError` before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model_cache.errors import InvalidVersionError
from model_cache.layout import (
    CONFIG_NAME,
    validate_digest,
    validate_model_name,
    validate_relpath,
    validate_version,
)

MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_CONFIG_BYTES = 1024 * 1024
MAX_FILES = 10_000

_DEFAULT_FILENAME_RE = re.compile(r'^\s*default_model_filename\s*:\s*"([^"]+)"', re.MULTILINE)
_ENSEMBLE_RE = re.compile(r'^\s*platform\s*:\s*"ensemble"', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One file of a version: its path inside the version, content digest and size."""

    path: str
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything a version folder holds; its SHA-256 identifies the version's content."""

    model: str
    version: int
    dirs: tuple[str, ...]
    files: tuple[ManifestEntry, ...]

    def to_bytes(self) -> bytes:
        """Canonical JSON: sorted keys, no whitespace, UTF-8."""
        body = {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "version": self.version,
            "dirs": sorted(self.dirs),
            "files": {e.path: {"digest": e.digest, "size": e.size} for e in self.files},
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        """SHA-256 of `to_bytes()`, in hex."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def total_bytes(self) -> int:
        """Sum of the listed files' sizes (shared content counted each time)."""
        return sum(e.size for e in self.files)

    @classmethod
    def build(
        cls, model: str, version: int, dirs: list[str], files: list[ManifestEntry]
    ) -> Manifest:
        """A manifest with its lists sorted, so equal content gives equal manifests.

        Args:
            model: Model name.
            version: Version number.
            dirs: Directory paths inside the version (the version folder included).
            files: The files.

        Returns:
            The manifest.
        """
        return cls(model, version, tuple(sorted(dirs)), tuple(sorted(files, key=_entry_path)))

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate a manifest.

        Args:
            data: The bytes of `manifest.json`.

        Raises:
            InvalidVersionError: Too large, not JSON, wrong format, or bad names/paths/digests.

        Returns:
            The manifest.
        """
        if len(data) > MAX_MANIFEST_BYTES:
            raise InvalidVersionError("manifest is too large")
        try:
            body = json.loads(data)
            if body["format"] != MANIFEST_FORMAT:
                raise InvalidVersionError(f"unknown manifest format {body['format']!r}")
            model = validate_model_name(str(body["model"]))
            version = validate_version(body["version"])
            dirs = [_check_inside(validate_relpath(str(d)), version) for d in body["dirs"]]
            files = [
                ManifestEntry(
                    _check_inside(validate_relpath(str(path)), version),
                    validate_digest(str(info["digest"])),
                    _non_negative(info["size"]),
                )
                for path, info in body["files"].items()
            ]
        # RecursionError: JSON nested deeper than the parser's stack.
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise InvalidVersionError(f"malformed manifest: {exc}") from exc
        return cls.build(model, version, dirs, files)


def _entry_path(entry: ManifestEntry) -> str:
    return entry.path


def _non_negative(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad size {value!r}")
    return value


def _check_inside(path: str, version: int) -> str:
    top = path.split("/", 1)[0]
    if path != CONFIG_NAME and top != str(version):
        raise InvalidVersionError(f"path {path!r} is outside config.pbtxt and {version}/")
    return path


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file to install: its path inside the version and where to read it."""

    path: str
    source: Path
    size: int


@dataclass(frozen=True, slots=True)
class SourceTree:
    """A checked source folder: the files and directories that make the version."""

    files: tuple[SourceFile, ...]
    dirs: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        """Sum of the files' sizes."""
        return sum(f.size for f in self.files)


def scan_source(source_dir: Path, version: int) -> SourceTree:
    """Check a source model folder and list what version `version` of it consists of.

    Args:
        source_dir: A Triton model folder holding `config.pbtxt` and `VERSION/`.
        version: Which version folder to take.

    Raises:
        InvalidVersionError: No config, no version folder, no model file (see `_check_model_file`),
            a symlink or special file, a bad path, or more than `MAX_FILES` files.

    Returns:
        The files (config first, then by path) and directories (sorted) to install.
    """
    validate_version(version)
    config = source_dir / CONFIG_NAME
    version_root = source_dir / str(version)
    if not _is_kind(config, stat.S_ISREG):
        raise InvalidVersionError(f"{source_dir}: missing {CONFIG_NAME}", version=version)
    if not _is_kind(version_root, stat.S_ISDIR):
        raise InvalidVersionError(f"{source_dir}: missing version folder {version}/")
    files = [SourceFile(CONFIG_NAME, config, config.stat().st_size)]
    dirs = [str(version)]
    for dirpath, dirnames, filenames in os.walk(version_root):
        base = Path(dirpath)
        rel_base = base.relative_to(source_dir).as_posix()
        for name in sorted(dirnames + filenames):
            path = base / name
            rel = validate_relpath(f"{rel_base}/{name}")
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                dirs.append(rel)
            elif stat.S_ISREG(mode):
                files.append(SourceFile(rel, path, os.lstat(path).st_size))
            else:
                raise InvalidVersionError(f"{path}: not a regular file or directory")
        if len(files) > MAX_FILES:
            raise InvalidVersionError(f"{source_dir}: more than {MAX_FILES} files")
    _check_model_file(config, version, files, dirs)
    ordered = files[:1] + sorted(files[1:], key=lambda f: f.path)
    return SourceTree(tuple(ordered), tuple(sorted(dirs)))


def _is_kind(path: Path, predicate: Callable[[int], bool]) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    return predicate(mode)


def _check_model_file(config: Path, version: int, files: list[SourceFile], dirs: list[str]) -> None:
    """Lightweight check that the version folder holds a model; the agent parses fully at load.

    An ensemble needs no file. A config naming `default_model_filename` needs that entry;
    otherwise some entry `model*` (model.onnx, model.plan, model.py, model.savedmodel/…) must
    be at the top of the version folder.
    """
    if config.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidVersionError(f"{config}: over {MAX_CONFIG_BYTES} bytes", version=version)
    text = config.read_text(encoding="utf-8", errors="replace")
    if _ENSEMBLE_RE.search(text):
        return
    prefix = f"{version}/"
    paths = [f.path for f in files] + dirs
    top = {p[len(prefix) :].split("/", 1)[0] for p in paths if p.startswith(prefix)}
    named = _DEFAULT_FILENAME_RE.search(text)
    if named is not None:
        if named.group(1) not in top:
            raise InvalidVersionError(
                f"missing model file {version}/{named.group(1)} named by {CONFIG_NAME}",
                version=version,
            )
    elif not any(name.startswith("model") for name in top):
        raise InvalidVersionError(f"missing model file in {version}/", version=version)
