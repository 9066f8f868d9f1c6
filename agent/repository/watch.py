"""Poll mode: watch the model repository and act on a model once its folder is complete.

Three parts, pure first:

* `ChangeTracker` debounces filesystem events per model. It is fed timestamps (`note(model,
  now)`) and never reads a clock or starts a thread: `due(now)` hands out the models that have
  been quiet for `quiet_s`, `deadline()` says when that can next happen, and `retry(model, now)`
  re-examines a model that was not ready after a delay that doubles up to `max_retry_s`.
* `model_folder_ready` judges one model folder (config, version policy, model files) on disk.
* `RepositoryWatcher` is the adapter: a watchdog observer thread forwards events into the event
  loop, a loop timer drives the tracker, and ready models go to the `on_ready` callback.

Invariants:

* `on_ready(model)` is only awaited after the folder was quiet for `quiet_s` and
  `model_folder_ready` said yes: every version the policy selects has its model file, each ONNX
  file parses as a whole protobuf, and no temp/partial file (`*.tmp`, `*.part`, dotfiles) is
  left in the model folder or a selected version folder. A half-copied folder is never acted on.
* Callbacks for one model never overlap; changes seen while one runs cause one more check after.
* Events are read from the watchdog thread only through `loop.call_soon_threadsafe`; all state
  lives on the event loop. Reads (open/close-without-write) are ignored, so the checker's and the
  loader's own reads never re-trigger a check.

Example::

    watcher = RepositoryWatcher(repo, manager.load, on_removed=manager.unload, quiet_s=1.0)
    await watcher.start()
    ...
    await watcher.stop()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from google.protobuf.message import DecodeError
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from agent.errors import AgentError, ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.proto import onnx_model_pb2 as onnx_pb
from agent.repository import layout as repository
from agent.repository.model_config import load_model_config

__all__ = ["ChangeTracker", "RepositoryWatcher", "model_folder_ready", "model_of_path"]

logger = logging.getLogger(__name__)

_PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")
# Writes, renames and metadata changes; "opened" and "closed_no_write" are reads.
_CHANGE_EVENTS = frozenset({"created", "modified", "deleted", "moved", "closed", "attrib"})


class ChangeTracker:
    """Per-model debounce of filesystem events, fed monotonic timestamps (no clock, no threads)."""

    def __init__(
        self, quiet_s: float, *, retry_s: float | None = None, max_retry_s: float = 30.0
    ) -> None:
        """Set the delays.

        Args:
            quiet_s: silence after a model's last change before it is due.
            retry_s: first re-check delay of a model that was not ready (default 2 x quiet_s),
                doubled after each further failed check.
            max_retry_s: the longest re-check delay.
        """
        self.quiet_s = quiet_s
        self.retry_s = 2 * quiet_s if retry_s is None else retry_s
        self.max_retry_s = max(max_retry_s, self.retry_s)
        self._due_at: dict[str, float] = {}
        self._attempts: dict[str, int] = {}

    def note(self, model: str, now: float) -> None:
        """Record a change under `model`; it becomes due `quiet_s` after its last change."""
        self._due_at[model] = now + self.quiet_s
        self._attempts.pop(model, None)  # a change is progress: start the backoff over

    def retry(self, model: str, now: float) -> None:
        """Re-examine `model` later; a no-op when a change already made it due again."""
        if model in self._due_at:
            return
        attempt = self._attempts.get(model, 0)
        self._attempts[model] = attempt + 1
        self._due_at[model] = now + min(self.retry_s * 2**attempt, self.max_retry_s)

    def due(self, now: float) -> set[str]:
        """The models quiet since their last change (or due for a retry); forgets them."""
        ready = {m for m, at in self._due_at.items() if at <= now}
        for model in ready:
            del self._due_at[model]
        return ready

    def deadline(self) -> float | None:
        """The earliest time `due` can return a model; None when nothing is pending."""
        return min(self._due_at.values(), default=None)


def model_of_path(root: Path, path: str | bytes) -> str | None:
    """The model an event path belongs to: its first component below `root`.

    None for `root` itself, for paths outside it and for hidden entries (`.staging`) directly
    under it. Hidden files deeper down do count: writing them is a copy in progress.
    """
    text = path.decode() if isinstance(path, bytes) else path
    try:
        parts = Path(text).relative_to(root).parts
    except ValueError:
        return None
    if not parts or parts[0].startswith("."):
        return None
    return parts[0]


def model_folder_ready(model_dir: Path, model_filename: str = "model.onnx") -> tuple[bool, str]:
    """Whether a model folder is complete enough to load (blocking I/O: call from a thread).

    Args:
        model_dir: REPOSITORY/MODEL.
        model_filename: the model file when there is no config.pbtxt (with one, the config's
            `default_model_filename` or its platform default, as the registry reads it).

    Returns:
        (True, summary) or (False, reason). Not ready when config.pbtxt does not parse, a temp
        or partial file is present, there is no version folder, a selected version lacks its
        model file, or an ONNX model file is truncated or empty.
    """
    try:
        return _check_folder(model_dir, model_filename)
    except OSError as exc:  # the folder changed (or vanished) while we looked
        return False, f"cannot read {model_dir}: {exc}"


def _check_folder(model_dir: Path, default_filename: str) -> tuple[bool, str]:
    try:
        config = load_model_config(model_dir)
    except ModelConfigError as exc:
        return False, exc.message
    partial = _partial_file([p for p in model_dir.iterdir() if p.is_file()])
    if partial is not None:
        return False, f"temporary file {partial}"
    filename = repository.model_filename(config) if config is not None else default_filename
    policy = config.version_policy if config is not None else mc.ModelVersionPolicy()
    wanted = repository.select_versions(policy, repository.list_versions(model_dir))
    if not wanted:
        return False, f"no version folder selected in {model_dir}"
    for version in wanted:
        version_dir = model_dir / str(version)
        if not version_dir.is_dir():
            return False, f"version {version} (named by the version policy) is missing"
        partial = _partial_file(list(version_dir.rglob("*")))
        if partial is not None:
            return False, f"temporary file {partial}"
        path = version_dir / filename
        if not path.is_file():
            return False, f"{path} is missing"
        if path.suffix == ".onnx":
            reason = _onnx_incomplete(path)
            if reason:
                return False, reason
    return True, f"versions {wanted} complete"


def _partial_file(paths: list[Path]) -> Path | None:
    for path in paths:
        name = path.name.lower()
        if name.startswith(".") or name.endswith(_PARTIAL_SUFFIXES):
            return path
    return None


def _onnx_incomplete(path: Path) -> str:
    """Empty when `path` is a whole ONNX model, else why not (read with the agent's own code
    for ONNX's format: no onnx package, which is the quantize extra's)."""
    model = onnx_pb.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except (DecodeError, ValueError) as exc:  # truncated inside a field
        return f"{path} is not a complete ONNX model: {exc}"
    # A cut at a field boundary still parses; protobuf writes fields in number order, so the
    # graph (7) and then opset_import (8) being present means the bulk of the file is there.
    if not model.HasField("graph") or not model.opset_import:
        return f"{path} is not a complete ONNX model: graph or opset_import missing"
    return ""


class _Forwarder(FileSystemEventHandler):
    """Runs in watchdog's thread: hand each change to the loop, nothing else."""

    def __init__(
        self, root: Path, loop: asyncio.AbstractEventLoop, sink: Callable[[str], None]
    ) -> None:
        self._root, self._loop, self._sink = root, loop, sink

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in _CHANGE_EVENTS:
            return
        for path in (event.src_path, event.dest_path):
            model = model_of_path(self._root, path) if path else None
            if model is not None:
                try:
                    self._loop.call_soon_threadsafe(self._sink, model)
                except RuntimeError:  # the loop is closed: we are shutting down
                    return


class RepositoryWatcher:
    """Watch a repository; await `on_ready(model)` when a changed model folder is complete."""

    def __init__(
        self,
        root: Path,
        on_ready: Callable[[str], Awaitable[None]],
        *,
        quiet_s: float = 1.0,
        retry_s: float | None = None,
        max_retry_s: float = 30.0,
        model_filename_for: Callable[[str], str] | None = None,
        on_removed: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._root = root.absolute()
        self._on_ready = on_ready
        self._on_removed = on_removed
        self._filename_for = model_filename_for or (lambda _model: "model.onnx")
        self._tracker = ChangeTracker(quiet_s, retry_s=retry_s, max_retry_s=max_retry_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observer: BaseObserver | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    async def start(self) -> None:
        """Start watching (recursively).

        Raises:
            OSError: the repository cannot be watched (missing, or out of inotify watches).
        """
        loop = self._loop = asyncio.get_running_loop()
        observer = Observer()
        observer.schedule(
            _Forwarder(self._root, loop, self._changed), str(self._root), recursive=True
        )
        self._observer = observer  # set first: events during start-up count
        try:
            await asyncio.to_thread(observer.start)  # a watch per folder: keep it off the loop
        except BaseException:
            self._observer = None
            raise
        logger.info("watching model repository %s (quiet %.2fs)", self._root, self._tracker.quiet_s)

    async def stop(self) -> None:
        """Stop watching; checks and callbacks in progress are cancelled."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            await asyncio.to_thread(observer.join)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._again.clear()
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _changed(self, model: str) -> None:
        if self._observer is None or self._loop is None:
            return  # stopped; a last event was still in flight
        self._tracker.note(model, self._loop.time())
        self._arm()

    def _arm(self) -> None:
        deadline = self._tracker.deadline()
        if self._loop is None or deadline is None:
            return
        if self._timer is not None and self._timer.when() <= deadline:
            return  # fires early at worst; `_fire` then re-arms
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._loop is None or self._observer is None:
            return
        for model in sorted(self._tracker.due(self._loop.time())):
            self._start_check(model)
        self._arm()

    def _start_check(self, model: str) -> None:
        if model in self._running:
            self._again.add(model)  # serialize: check once more when this one is done
            return
        assert self._loop is not None
        task = self._loop.create_task(self._check(model), name=f"repository-watch:{model}")
        self._running[model] = task
        task.add_done_callback(lambda _task: self._finished(model))

    def _finished(self, model: str) -> None:
        del self._running[model]
        if model in self._again and self._observer is not None:
            self._again.discard(model)
            self._start_check(model)

    async def _check(self, model: str) -> None:
        model_dir = self._root / model
        verdict = await asyncio.to_thread(_examine, model_dir, self._filename_for(model))
        if verdict is None:
            logger.info("model %s: folder removed from the repository", model)
            if self._on_removed is not None:
                await self._call(self._on_removed, model, "unload")
            return
        ready, reason = verdict
        if not ready:
            logger.info("model %s: not ready to load yet: %s", model, reason)
            assert self._loop is not None
            self._tracker.retry(model, self._loop.time())
            self._arm()
            return
        logger.info("model %s: folder complete (%s), loading", model, reason)
        await self._call(self._on_ready, model, "load")

    @staticmethod
    async def _call(callback: Callable[[str], Awaitable[None]], model: str, what: str) -> None:
        try:
            await callback(model)
        except AgentError as exc:  # the agent records the reason itself
            logger.warning("model %s: %s after a repository change failed: %s", model, what, exc)
        except Exception:
            logger.exception("model %s: %s after a repository change raised", model, what)


def _examine(model_dir: Path, model_filename: str) -> tuple[bool, str] | None:
    """None when the model folder is gone, else `model_folder_ready`'s verdict."""
    if not model_dir.is_dir():
        return None
    return model_folder_ready(model_dir, model_filename)
