"""Models whose files come in the load request (Triton's `file:<path>` load parameters).

Triton's load accepts a model's files with its config: `{"parameters": {"config": "<json>",
"file:1/model.onnx": <bytes>}}`. Triton writes them to a temporary model folder, loads the
model from there and deletes the folder when the model is unloaded; so does the agent:

* `parse_file_parameters` (pure) checks the request: `config` is required with files, every
  path stays inside the model folder (no absolute path, no `..` above it, no empty
  component), no file is also a directory, and the total is bounded.
* `PushedModels.load` writes the files into `ROOT/.staging-<random>/`, flushes every file and
  directory, renames the folder to `ROOT/<model>-<random>/` (one rename(2): a folder under that
  name is complete), then loads it through `ModelManager.load` (a hot swap like any other: a
  failed build leaves what served before serving). On success the folder the model was pushed
  from before is removed; on failure the new one is.
* A pushed model is served from memory after load; its folder is removed on unload, when the
  model is loaded from the repository again, and at shutdown. Every folder under ROOT at
  start-up (a crash, kill -9 half-way through staging) is removed: a pushed model does not
  survive a restart, as in Triton, whose temporary folders are gone with the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from agent.errors import AgentError, InvalidInputError, RepositoryPollError
from agent.models.control import ModelManager
from agent.proto import model_config_pb2 as mc
from model_cache.atomic import fsync_dir

__all__ = ["FILE_PREFIX", "MAX_FILES", "PushedFiles", "PushedModels", "parse_file_parameters"]

logger = logging.getLogger(__name__)

FILE_PREFIX = "file:"
MAX_FILES = 10_000  # as many as a cached version may hold
_STAGING = ".staging-"


@dataclass(frozen=True, slots=True)
class PushedFiles:
    """The checked files of one load request: normalized relative path -> content."""

    files: Mapping[str, bytes]

    @property
    def total_bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


def parse_file_parameters(
    files: Mapping[str, bytes], *, has_config: bool, max_bytes: int
) -> PushedFiles | None:
    """Check the `file:` parameters of a load request (pure).

    Args:
        files: parameter name (with the `file:` prefix) -> decoded content.
        has_config: whether the request has a `config` parameter.
        max_bytes: the most the files may hold together (the server's request bound).

    Returns:
        The files by normalized path, or None when the request has none.

    Raises:
        InvalidInputError: no config, a path outside the model folder, a file that is also a
            directory, too many files or bytes (Triton's wording where Triton has one).
    """
    if not files:
        return None
    if not has_config:
        raise InvalidInputError("Load parameter 'config' must be specified for model file override")
    if len(files) > MAX_FILES:
        raise InvalidInputError(f"too many file parameters: {len(files)}, at most {MAX_FILES}")
    checked: dict[str, bytes] = {}
    for name, data in files.items():
        checked[_relative_path(name)] = data
    total = sum(len(data) for data in checked.values())
    if total > max_bytes:
        raise InvalidInputError(
            f"file parameters hold {total} bytes, over the limit of {max_bytes} bytes "
            "(server.max_request_bytes)"
        )
    for path in checked:
        parent = posixpath.dirname(path)
        while parent:
            if parent in checked:
                raise InvalidInputError(
                    f"Invalid file parameter '{FILE_PREFIX}{path}', "
                    "directory has been created as a file"
                )
            parent = posixpath.dirname(parent)
    return PushedFiles(checked)


def _relative_path(name: str) -> str:
    """The normalized path a `file:` parameter names, refused when it leaves the model folder."""
    relpath = name[len(FILE_PREFIX) :] if name.startswith(FILE_PREFIX) else name
    if not relpath or "\0" in relpath or "\\" in relpath:
        raise InvalidInputError(f"Invalid file parameter '{name}': not a relative file path")
    normalized = posixpath.normpath(relpath)
    if (
        relpath.startswith("/")
        or normalized == ".."
        or normalized.startswith("../")
        or normalized == "."
    ):
        raise InvalidInputError(
            f"Invalid file parameter '{name}' with normalized path '{normalized}' "
            "must stay within model directory."
        )
    return normalized


class PushedModels:
    """The folders of models loaded from files in the request, under one root directory."""

    def __init__(self, root: Path) -> None:
        """Take `root` over: whatever is left there from an earlier run is removed."""
        self.root = root
        self._current: dict[str, Path] = {}
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.iterdir():
            logger.info("removing %s left by an earlier run", leftover.name)
            _remove(leftover)

    def folder(self, name: str) -> Path | None:
        """The folder a model is served from now, when it was pushed."""
        return self._current.get(name)

    async def load(
        self,
        manager: ModelManager,
        name: str,
        config: mc.ModelConfig,
        files: PushedFiles,
    ) -> str:
        """Write the files and the config into a fresh folder and load the model from it.

        Returns:
            The swap strategy used.

        Raises:
            AgentError: as `ModelManager.load`; the folder is removed and what served before
                keeps serving.
            RepositoryPollError: the files could not be written (nothing is left behind).
        """
        try:
            folder = await asyncio.to_thread(self._write, name, config, files)
        except OSError as exc:  # a name too long, a full disk: the client's files, not a crash
            raise RepositoryPollError(
                f"could not write the files sent with the load request: {exc.strerror}"
            ) from None
        try:
            strategy = await manager.load(name, config, source=folder)
        except AgentError as exc:
            await asyncio.to_thread(_remove, folder)
            # The client sent the files: it is told their paths in the model, not on the device.
            raise type(exc)(exc.message.replace(str(folder), name)) from None
        except BaseException:
            await asyncio.to_thread(_remove, folder)
            raise
        previous = self._current.get(name)
        self._current[name] = folder
        if previous is not None:
            await asyncio.to_thread(_remove, previous)
        logger.info(
            "model %s loaded from %d file(s) sent with the load request (%d bytes)",
            name,
            len(files.files),
            files.total_bytes,
            extra={"model": name},
        )
        return strategy

    async def forget(self, name: str) -> None:
        """The model no longer serves from pushed files (unloaded, or loaded from the
        repository): remove its folder."""
        folder = self._current.pop(name, None)
        if folder is not None:
            await asyncio.to_thread(_remove, folder)

    def close(self) -> None:
        """Remove every pushed folder (at shutdown, after the models are unloaded)."""
        self._current.clear()
        if self.root.is_dir():
            for entry in self.root.iterdir():
                _remove(entry)

    def _write(self, name: str, config: mc.ModelConfig, files: PushedFiles) -> Path:
        token = secrets.token_hex(6)
        staging = self.root / f"{_STAGING}{token}"
        try:
            staging.mkdir()
            for relpath, data in files.files.items():
                _write_file(staging / relpath, data)
            # The config is Triton's `config.pbtxt`, written last: it wins over a file of that name.
            _write_file(staging / "config.pbtxt", text_format.MessageToString(config).encode())
            _fsync_dirs(staging)
            final = self.root / f"{name}-{token}"
            os.rename(staging, final)
            fsync_dir(self.root)
        except BaseException:
            _remove(staging)
            raise
        return final


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dirs(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        fsync_dir(Path(dirpath))


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        logger.error("cannot remove %s: %s", path, exc)
