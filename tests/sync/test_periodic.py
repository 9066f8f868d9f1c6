"""The periodic loop: schedule (pure), backoff against an unreachable store, activation."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from model_cache import ModelCache, RejectionCause
from sync.client import SyncClient, SyncReport
from sync.config import SyncConfig
from sync.errors import SyncConfigError
from sync.periodic import Backoff, CycleResult, SyncLoop, run_periodic
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


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, str, dict[str, object]]] = []

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        self.seen.append((model, version, kind, dict(detail)))

    def kinds(self) -> list[tuple[str, int | None, str]]:
        return [(m, v, k) for m, v, k, _d in self.seen]


class _Switchable:
    """A syncer whose store can be cut and restored between cycles."""

    def __init__(self, live: SyncClient, dead: SyncClient) -> None:
        self.live, self.dead, self.up = live, dead, True

    def sync_once(self) -> SyncReport:
        return (self.live if self.up else self.dead).sync_once()


def test_store_failure_is_one_event_and_its_recovery_one(world: World, cache: ModelCache) -> None:
    world.publish("mlp", 1)
    dead = S3Store(
        "b", "p", S3Settings(f"http://127.0.0.1:{free_port()}", "us-east-1", max_attempts=1)
    )
    syncer = _Switchable(
        world.client(),
        SyncClient(dead, cache, world.trusted_root, world.work, parse_desired(["*=latest"])),
    )

    async def activate(model: str, version: int) -> None:
        cache.activate(model, version)

    events = _Events()
    now = [0.0]
    loop = SyncLoop(syncer, cache, activate, events=events.record, clock=lambda: now[0])

    async def cycles() -> list[CycleResult]:
        results = [await loop.cycle()]
        syncer.up = False
        for _ in range(6):
            now[0] += 30
            results.append(await loop.cycle())
        assert loop.state()["failing"] is not None
        syncer.up = True
        now[0] += 30
        results.append(await loop.cycle())
        return results

    results = asyncio.run(cycles())
    assert [r.ok for r in results] == [True] + [False] * 6 + [True]
    assert events.kinds() == [("*", None, "sync_failing"), ("*", None, "sync_recovered")]
    assert events.seen[1][3] == {"failed_cycles": 6, "failed_for_s": 180.0}
    assert loop.failures == 0
    assert active(cache, "mlp") == 1
    assert [e.kind for e in cache.events() if e.kind.startswith("sync_")] == []  # went to events


def test_failing_store_reminders_when_asked(world: World, cache: ModelCache) -> None:
    dead = S3Store(
        "b", "p", S3Settings(f"http://127.0.0.1:{free_port()}", "us-east-1", max_attempts=1)
    )
    client = SyncClient(dead, cache, world.trusted_root, world.work, parse_desired(["*=latest"]))

    async def activate(model: str, version: int) -> None:
        return None

    events = _Events()
    now = [0.0]
    loop = SyncLoop(
        client, cache, activate, events=events.record, remind_after_s=100, clock=lambda: now[0]
    )

    async def cycles() -> None:
        for _ in range(8):
            await loop.cycle()
            now[0] += 50

    asyncio.run(cycles())
    assert [d.get("reminder", False) for _m, _v, _k, d in events.seen] == [False, True, True]


def test_a_rejected_version_makes_the_loop_choose_again_at_once(
    world: World, cache: ModelCache
) -> None:
    world.publish("mlp", 1)
    world.publish("mlp", 2)
    swaps: list[tuple[str, int]] = []

    async def activate(model: str, version: int) -> None:  # the agent's swap, in short
        swaps.append((model, version))
        if version == 2:
            cache.rejections.reject(model, version, RejectionCause.FAILED, "does not load")
            raise RuntimeError("does not load")
        cache.activate(model, version)

    wait = _Recorder(cycles=3)
    events = _Events()
    asyncio.run(
        run_periodic(
            SyncConfig(interval_s=60, jitter_s=0),
            cache,
            activate,
            asyncio.Event(),
            client=world.client(),
            events=events.record,
            wait=wait,
            rand=lambda: 0.0,
        )
    )
    assert swaps == [("mlp", 2), ("mlp", 1)]  # no period in between, and never 2 again
    assert wait.delays == [60, 60, 60]
    assert active(cache, "mlp") == 1
    assert events.seen == []  # the swap tells its own failure; the sync adds nothing


def test_rejection_reminders_are_the_only_events_of_a_rejection(
    world: World, cache: ModelCache
) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    cache.rejections.reject("mlp", 1, RejectionCause.ROLLED_BACK, "an operator rolled back")

    async def activate(model: str, version: int) -> None:
        return None

    events = _Events()
    now = [0.0]
    loop = SyncLoop(
        world.client(),
        cache,
        activate,
        events=events.record,
        remind_after_s=10,
        clock=lambda: now[0],
    )

    async def cycles() -> None:
        for _ in range(4):
            await loop.cycle()
            now[0] += 10

    asyncio.run(cycles())
    assert [(k, d.get("reminder", False)) for _m, _v, k, d in events.seen] == [
        ("sync_failing", False),  # t=0: every signed version is rejected (the rejection: silent)
        ("sync_failing", True),  # t=10: reminders of both
        ("version_rejected", True),
        ("sync_failing", True),  # t=30: then twice as long after
        ("version_rejected", True),
    ]
    assert "every signed version of mlp is rejected" in str(events.seen[0][3]["reason"])
