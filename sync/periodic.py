"""The daemon's periodic sync: a cycle every `interval_s` plus jitter, backing off when failing.

    stop = asyncio.Event()
    task = asyncio.create_task(run_periodic(config.sync, cache, cached_versions.activate, stop))
    ...
    stop.set(); await task

`Backoff` is the pure schedule; `run_periodic` only drives it. The clock (`wait`) and the
randomness (`rand`) are injected, so tests check the schedule without sleeping.

Invariants:
    * Sync never stops serving: each cycle runs in a worker thread, its errors are logged and
      turn into a longer wait, and the cache's active versions change only through `activate`
      (the agent's hot swap: load the new version, then switch, then unload the old one).
    * After `k` failed cycles in a row the wait is `min(max, base * 2**(k-1))`, scaled by a
      random factor in [0.5, 1] ("equal jitter"); one successful cycle resets it to
      `interval + jitter * rand`.
    * `stop` ends the loop at the next wait or after the running cycle, never mid-install.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from model_cache import ModelCache
from sync.client import SyncClient, SyncReport
from sync.config import SyncConfig, validate
from sync.errors import SyncConfigError, SyncError
from sync.policy import parse_desired
from sync.stores import open_store

logger = logging.getLogger(__name__)

Activate = Callable[[str, int], Awaitable[object]]
Wait = Callable[[float, asyncio.Event], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to run the next cycle."""

    interval_s: float
    jitter_s: float
    base_s: float = 5.0
    max_s: float = 1800.0

    def delay(self, failures: int, rand: float) -> float:
        """Seconds until the next cycle.

        Args:
            failures: Failed cycles in a row (0 after a success).
            rand: A random number in [0, 1).

        Returns:
            The wait.
        """
        if failures <= 0:
            return self.interval_s + self.jitter_s * rand
        step = min(self.max_s, self.base_s * float(2 ** min(failures - 1, 32)))
        return step * (0.5 + 0.5 * rand)


async def wait_or_stop(delay: float, stop: asyncio.Event) -> None:
    """Wait `delay` seconds, or less when `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except asyncio.TimeoutError:
        return


def build_client(config: SyncConfig, cache: ModelCache) -> SyncClient:
    """Make the sync client a config describes.

    Args:
        config: A validated `[sync]` section.
        cache: The agent's model cache.

    Raises:
        SyncConfigError: Invalid settings or an unreadable trusted root.

    Returns:
        The client.
    """
    validate(config, cache.root)
    assert config.trusted_root is not None
    try:
        root = config.trusted_root.read_bytes()
    except OSError as exc:
        raise SyncConfigError(f"cannot read sync.trusted_root: {exc.strerror}") from None
    return SyncClient(
        open_store(config.source, config.s3),
        cache,
        root,
        config.work_dir or Path(cache.root) / "sync",
        parse_desired(config.desired),
        max_parallel=config.max_parallel,
        max_version_bytes=config.max_version_bytes,
    )


async def run_periodic(
    config: SyncConfig,
    cache: ModelCache,
    activate: Activate,
    stop: asyncio.Event,
    *,
    client: SyncClient | None = None,
    wait: Wait = wait_or_stop,
    rand: Callable[[], float] = random.random,
) -> None:
    """Sync until `stop` is set: one cycle at once, then on the `Backoff` schedule.

    Args:
        config: The `[sync]` section.
        cache: The agent's model cache.
        activate: The agent's hot swap, e.g. `CachedVersions.activate`.
        stop: Set it to end the loop.
        client: Replaces the client built from `config` (tests).
        wait: Waits between cycles (injected in tests).
        rand: Random numbers in [0, 1) for jitter (injected in tests).

    Raises:
        SyncConfigError: Invalid settings (raised before the first cycle).
    """
    syncer = client or build_client(config, cache)
    backoff = Backoff(config.interval_s, config.jitter_s, max_s=config.max_backoff_s)
    failures = 0
    while not stop.is_set():
        try:
            report = await asyncio.to_thread(syncer.sync_once)
        except SyncError as exc:
            failures += 1
            logger.warning("sync failed (%d in a row): %s", failures, exc.message)
        else:
            failures = failures + 1 if report.transient else 0
            await _activate_all(report, activate, stop)
        delay = backoff.delay(failures, rand())
        logger.debug("next sync in %.1f s", delay)
        await wait(delay, stop)


async def _activate_all(report: SyncReport, activate: Activate, stop: asyncio.Event) -> None:
    for model, version in report.activate:
        if stop.is_set():
            return
        try:
            await activate(model, version)
        except Exception:  # the swap raises the agent's errors; keep syncing and serving
            logger.exception("activating %s version %d failed; the old one serves", model, version)
        else:
            logger.info("now serving %s version %d", model, version)
