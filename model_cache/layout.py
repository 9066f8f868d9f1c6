"""Pure path rules of the cache root: where everything lives, and which names are valid.

Nothing here touches the disk. The tree under the cache root (`--cache-dir`)::

    ROOT/
      state.db (+ -wal, -shm)           SQLite state: models, versions, files, events
      lock                              flock(2)-ed by the one process that owns the cache
      blobs/sha256/ab/abcdef…(64 hex)   content-addressed files, read-only, stored once
      blobs/.tmp/                       blobs being written (recovery empties it)
      staging/<random>/                 a version being assembled (recovery empties it)
      versions/MODEL/VERSION-DIGEST12/  one installed version, read-only, renamed in complete:
          manifest.json                 {path: {digest, size}} for every file below
          config.pbtxt                  hard link to a blob
          VERSION/…                     the Triton version folder (hard links to blobs)
      views/vNNNNNNNN/                  one generation of the served view, built complete:
          MODEL/config.pbtxt  → ../../../versions/MODEL/VERSION-DIGEST12/config.pbtxt
          MODEL/VERSION       → ../../../versions/MODEL/VERSION-DIGEST12/VERSION
      repository → views/vNNNNNNNN      the SERVED Triton repository (`ModelCache.repository_path`)

Each installed version folder is itself a one-version Triton model folder (config + `VERSION/`),
so a whole version, config included, appears by one rename. DIGEST12 is the first 12 hex digits
of the SHA-256 of the version's manifest: a version's folder name changes when its content does.

Atomic switch: the served view is changed by ONE `os.replace` of the `repository` symlink. A new
generation `views/vN+1/` is built completely (real per-model directories holding relative
symlinks) before the swap, so a reader resolving `repository/MODEL/VERSION/model.onnx` sees the
whole old view or the whole new one, across all models at once. Per-model symlinks were rejected:
a change touching two models would be two operations. The previous generation is kept until the
next swap (or GC), so a reader that resolved `repository` just before a swap still finds its
files; readers must not `resolve()` the repository path once and keep the result.

Invariants:
    * Every name built here was validated first: model names are `[A-Za-z0-9][A-Za-z0-9_.-]*`
      (not `.`/`..`, at most 128 chars), versions are positive ints, digests 64 lowercase hex.
    * Relative file paths inside a version never escape it (no `..`, no absolute paths, no empty
      or hidden-temp components).
    * Symlink targets are relative, so the cache root can be moved or bind-mounted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from model_cache.atomic import TEMP_PREFIX
from model_cache.errors import InvalidVersionError

CONFIG_NAME = "config.pbtxt"
MANIFEST_NAME = "manifest.json"
DIGEST_ALGORITHM = "sha256"
DIGEST_PREFIX_LENGTH = 12

_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_VERSION_DIR_RE = re.compile(r"([1-9][0-9]{0,17})-([0-9a-f]{12})")
_VIEW_RE = re.compile(r"v([0-9]{8,})")
_MAX_COMPONENT = 255


def validate_model_name(model: str) -> str:
    """Check a model name before it becomes a directory name.

    Args:
        model: The name, as in `repository/MODEL/`.

    Raises:
        InvalidVersionError: The name is empty, too long, `.`/`..`, or has other characters.

    Returns:
        `model`, unchanged.
    """
    if not _MODEL_RE.fullmatch(model) or model in {".", ".."}:
        raise InvalidVersionError(f"invalid model name {model!r}", model=model)
    return model


def validate_version(version: int) -> int:
    """Check a version number (Triton versions are positive integers).

    Args:
        version: The version number.

    Raises:
        InvalidVersionError: Not an int, or not in 1..10**18-1.

    Returns:
        `version`, unchanged.
    """
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version < 10**18:
        raise InvalidVersionError(f"invalid version number {version!r}", version=None)
    return version


def validate_digest(digest: str) -> str:
    """Check a SHA-256 digest in lowercase hex.

    Args:
        digest: 64 hex digits.

    Raises:
        InvalidVersionError: Anything else.

    Returns:
        `digest`, unchanged.
    """
    if not _DIGEST_RE.fullmatch(digest):
        raise InvalidVersionError(f"invalid sha256 digest {digest!r}")
    return digest


def validate_relpath(path: str) -> str:
    """Check a file path inside a version folder, in POSIX form.

    Args:
        path: E.g. `config.pbtxt` or `1/model.onnx`.

    Raises:
        InvalidVersionError: Empty, absolute, with `.`/`..`/empty components, a backslash or NUL,
            a component over 255 bytes, or a component using the cache's temp prefix.

    Returns:
        `path`, unchanged.
    """
    pure = PurePosixPath(path)
    parts = path.split("/")
    bad = (
        not path
        or pure.is_absolute()
        or "\\" in path
        or "\x00" in path
        or any(p in {"", ".", ".."} for p in parts)
        or any(len(p.encode()) > _MAX_COMPONENT or p.startswith(TEMP_PREFIX) for p in parts)
    )
    if bad:
        raise InvalidVersionError(f"invalid path in version folder: {path!r}")
    return path


def version_dirname(version: int, digest: str) -> str:
    """The folder name of an installed version: `VERSION-DIGEST12`."""
    return f"{version}-{digest[:DIGEST_PREFIX_LENGTH]}"


def parse_version_dirname(name: str) -> tuple[int, str] | None:
    """Inverse of `version_dirname`: (version, digest prefix), or None for any other name."""
    match = _VERSION_DIR_RE.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def view_name(generation: int) -> str:
    """The folder name of a view generation: `v00000001`."""
    return f"v{generation:08d}"


def parse_view_name(name: str) -> int | None:
    """Inverse of `view_name`: the generation, or None for any other name."""
    match = _VIEW_RE.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """Every path under one cache root. Pure: building a path never touches the disk.

    Args:
        root: The cache root directory.
    """

    root: Path

    @property
    def state_db(self) -> Path:
        """The SQLite database."""
        return self.root / "state.db"

    @property
    def lock_file(self) -> Path:
        """The file the owning process holds an exclusive flock on."""
        return self.root / "lock"

    @property
    def blobs_dir(self) -> Path:
        """Root of the content-addressed store (`blobs/sha256`)."""
        return self.root / "blobs" / DIGEST_ALGORITHM

    @property
    def blob_tmp_dir(self) -> Path:
        """Where blobs are written before their digest is known."""
        return self.root / "blobs" / ".tmp"

    @property
    def staging_dir(self) -> Path:
        """Parent of in-progress version folders."""
        return self.root / "staging"

    @property
    def versions_dir(self) -> Path:
        """Parent of every model's installed versions."""
        return self.root / "versions"

    @property
    def views_dir(self) -> Path:
        """Parent of the view generations."""
        return self.root / "views"

    @property
    def repository(self) -> Path:
        """The served repository: a symlink to the current view generation."""
        return self.root / "repository"

    def blob_path(self, digest: str) -> Path:
        """`blobs/sha256/ab/abcdef…` for a digest (validated)."""
        validate_digest(digest)
        return self.blobs_dir / digest[:2] / digest

    def model_dir(self, model: str) -> Path:
        """`versions/MODEL`, holding every installed version of a model."""
        return self.versions_dir / validate_model_name(model)

    def version_dir(self, model: str, version: int, digest: str) -> Path:
        """`versions/MODEL/VERSION-DIGEST12`: one installed version (a one-version model dir)."""
        validate_digest(digest)
        return self.model_dir(model) / version_dirname(validate_version(version), digest)

    def view_dir(self, name: str) -> Path:
        """`views/NAME`: one view generation."""
        if parse_view_name(name) is None:
            raise InvalidVersionError(f"invalid view name {name!r}")
        return self.views_dir / name

    @staticmethod
    def repository_target(name: str) -> str:
        """The `repository` symlink's content for a view generation (relative to the root)."""
        return f"views/{name}"

    @staticmethod
    def view_targets(model: str, version: int, digest: str) -> tuple[str, str]:
        """Symlink contents of `views/NAME/MODEL/config.pbtxt` and `views/NAME/MODEL/VERSION`.

        Returns:
            (config target, version folder target), relative to `views/NAME/MODEL/`.
        """
        unit = f"../../../versions/{validate_model_name(model)}/{version_dirname(version, digest)}"
        return f"{unit}/{CONFIG_NAME}", f"{unit}/{validate_version(version)}"
