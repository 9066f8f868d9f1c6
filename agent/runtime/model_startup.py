"""What the agent serves at start-up: the model cache, the initial load, poll-mode watching,
and the folder of models loaded from request files.

Each part that holds a resource is entered into the start-up exit stack, so a start-up that
fails half way, and a shutdown, close it again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config.schema import AgentConfig
from agent.errors import AgentError, ModelLoadError, ModelNotFoundError
from agent.models.control import ModelControlMode, ModelManager
from agent.models.pushed import PushedModels
from agent.models.registry import ModelRegistry
from model_cache.errors import CacheError

if TYPE_CHECKING:
    from model_cache.versions import ModelCache

__all__ = ["initial_load", "open_cache", "pushed_models", "watch_repository"]

logger = logging.getLogger(__name__)


def open_cache(config: AgentConfig) -> ModelCache:
    """Open (and recover) the model cache; raises ModelLoadError when it cannot be used."""
    assert config.cache.dir is not None
    from model_cache.versions import ModelCache  # noqa: PLC0415 - SQLite only with cache.dir

    try:
        cache = ModelCache(
            config.cache.dir, disk_budget_bytes=config.cache.disk_budget_bytes or None
        )
    except CacheError as exc:
        raise ModelLoadError(f"model cache {config.cache.dir}: {exc}") from None
    report = cache.last_recovery
    logger.info("model cache %s opened (recovery: %s)", config.cache.dir, report)
    return cache


def initial_load(
    registry: ModelRegistry, mode: ModelControlMode, names: tuple[str, ...]
) -> dict[str, str]:
    """Triton's start-up rule: all models, except in explicit mode only those named."""
    if mode is not ModelControlMode.EXPLICIT or "*" in names:
        return registry.load_all()
    failures: dict[str, str] = {}
    for name in names:
        try:
            registry.load_model(name)
        except AgentError as exc:
            failures[name] = exc.message
    return failures


async def watch_repository(
    stack: contextlib.AsyncExitStack, config: AgentConfig, repo: Path, manager: ModelManager
) -> None:
    """Poll mode: (re)load a model folder once a change is complete, unload a removed one."""
    from agent.repository.watch import RepositoryWatcher  # noqa: PLC0415 - watchdog: poll mode

    watcher = RepositoryWatcher(
        repo,
        functools.partial(_reload, manager),
        on_removed=functools.partial(_unload_if_known, manager),
        quiet_s=config.models.poll_quiet_ms / 1000,
    )
    await watcher.start()
    stack.push_async_callback(watcher.stop)


async def _reload(manager: ModelManager, name: str) -> None:
    """Poll mode: a model folder changed and is complete."""
    await manager.load(name)


async def _unload_if_known(manager: ModelManager, name: str) -> None:
    """Poll mode: a model folder was removed."""
    with contextlib.suppress(ModelNotFoundError):
        await manager.unload(name)


def pushed_models(config: AgentConfig, stack: contextlib.AsyncExitStack) -> PushedModels:
    """Where models loaded from request files live: in the cache directory when there is one
    (cleared at start-up, so nothing a crash left is kept), else a private temporary folder."""
    if config.cache.dir is not None:
        pushed = PushedModels(config.cache.dir / "pushed")
        stack.callback(pushed.close)
    else:
        pushed = PushedModels(Path(tempfile.mkdtemp(prefix="edge-agent-pushed-")))
        stack.callback(shutil.rmtree, pushed.root, ignore_errors=True)
    return pushed
