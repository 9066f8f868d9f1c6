"""The periodic loop: schedule (pure), backoff against an unreachable store, activation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from model_cache import ModelCache
from sync.client import SyncClient
from sync.config import SyncConfig
from sync.errors import SyncConfigError
from sync.periodic import Backoff, run_periodic
from sync.policy import parse_desired
from sync.s3 import S3Store
from sync.store import S3Settings
from tests.support import free_port
from tests.sync.support import World, active


def test_backoff_schedule() -> None:
    backoff = Backoff(interval_s=300, jitter_s=30, base_s=5, max_s=600)
    assert backoff.delay(0, 0.0) == 300
    assert backoff.delay(0, 0.5) == 315
    assert [backoff.delay(k, 1.0) for k in range(1, 9)] == [5, 10, 20, 40, 80, 160, 320, 600]
    assert backoff.delay(3, 0.0) == 10  # equal jitter: at least half the step
    assert backoff.delay(10_000, 1.0) == 600


class _Recorder:
    """Injected wait: records delays and stops the loop after `cycles` waits."""

    def __init__(self, cycles: int) -> None:
        self.delays: list[float] = []
        self.cycles = cycles

    async def __call__(self, delay: float, stop: asyncio.Event) -> None:
        self.delays.append(delay)
        if len(self.delays) >= self.cycles:
            stop.set()


def test_unreachable_store_backs_off_and_keeps_serving(world: World, cache: ModelCache) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    dead = S3Store(
        "b", "p", S3Settings(f"http://127.0.0.1:{free_port()}", "us-east-1", max_attempts=1)
    )
    client = SyncClient(dead, cache, world.trusted_root, world.work, parse_desired(["*=latest"]))
    wait = _Recorder(cycles=5)
    swaps: list[tuple[str, int]] = []

    async def activate(model: str, version: int) -> None:
        swaps.append((model, version))

    config = SyncConfig(interval_s=300, jitter_s=0, max_backoff_s=3600)
    asyncio.run(
        run_periodic(
            config, cache, activate, asyncio.Event(), client=client, wait=wait, rand=lambda: 1.0
        )
    )
    assert wait.delays == [5, 10, 20, 40, 80]
    assert swaps == []
    assert active(cache, "mlp") == 1


def test_periodic_sync_hands_new_versions_to_the_swap(world: World, cache: ModelCache) -> None:
    world.publish("mlp", 1)
    swaps: list[tuple[str, int]] = []

    async def activate(model: str, version: int) -> None:
        swaps.append((model, version))
        cache.activate(model, version)
        if len(swaps) == 1:
            world.publish("mlp", 2)  # published while the device runs

    wait = _Recorder(cycles=3)
    config = SyncConfig(interval_s=60, jitter_s=10)
    asyncio.run(
        run_periodic(
            config,
            cache,
            activate,
            asyncio.Event(),
            client=world.client(),
            wait=wait,
            rand=lambda: 0.5,
        )
    )
    assert swaps == [("mlp", 1), ("mlp", 2)]
    assert wait.delays == [65, 65, 65]
    assert active(cache, "mlp") == 2


def test_failed_swap_keeps_the_loop_alive(world: World, cache: ModelCache) -> None:
    world.publish("mlp", 1)

    async def activate(model: str, version: int) -> None:
        raise RuntimeError("model failed to load")

    wait = _Recorder(cycles=2)
    asyncio.run(
        run_periodic(
            SyncConfig(interval_s=60, jitter_s=0),
            cache,
            activate,
            asyncio.Event(),
            client=world.client(),
            wait=wait,
            rand=lambda: 0.0,
        )
    )
    assert wait.delays == [60, 60]
    assert active(cache, "mlp") is None


def test_bad_config_fails_before_the_first_cycle(cache: ModelCache, tmp_path: Path) -> None:
    async def activate(model: str, version: int) -> None:
        return None

    config = SyncConfig(source="s3://b/p", trusted_root=tmp_path / "missing.json")
    with pytest.raises(SyncConfigError, match="trusted_root"):
        asyncio.run(run_periodic(config, cache, activate, asyncio.Event()))
