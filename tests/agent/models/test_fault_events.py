"""Faults the agent serves on through are events, never exceptions into a swap or a request.

A failing event sink cannot break or leak a hot swap; a failed canary state write, a corrupt
canary state file and a failed cache GC each become an event (through the `EventSink`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NoReturn

import pytest

import model_cache.gc
from agent.canary.control import CanaryManager
from agent.models.cache_control import CachedVersions, CacheEvents
from agent.models.control import ModelManager
from agent.models.events import EventTee
from agent.models.loader import LoadSettings
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.runtime.demo import mlp_model
from model_cache import CacheError, ModelCache
from tests.models import M_CONFIG as CONFIG
from tests.models import scale_model, write_model, write_versions
from tests.support import RecordingEvents as Events
from tests.support import promote


class Broken:
    """An event sink that fails like a full disk until it is repaired."""

    def __init__(self) -> None:
        self.broken = True
        self.seen: list[str] = []

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        if self.broken:
            raise OSError(28, "No space left on device")
        self.seen.append(kind)


class Listener(Events):
    """A sink that is also told which sinks fail."""

    def __init__(self) -> None:
        super().__init__()
        self.health: list[dict[str, str]] = []

    def sinks_failing(self, failing: Mapping[str, str]) -> None:
        self.health.append(dict(failing))


def test_tee_isolates_a_failing_sink_and_reports_it() -> None:
    broken, after, listener = Broken(), Events(), Listener()
    tee = EventTee(broken, after)
    tee.add(listener)
    assert listener.health == [{}]
    tee.record("m", 1, "version_activated", {})  # does not raise
    assert after.kinds() == listener.kinds() == ["version_activated"]
    reason = "OSError: [Errno 28] No space left on device"
    assert tee.failing() == {"Broken": reason}
    assert listener.health == [{}, {"Broken": reason}]
    tee.record("m", 1, "model_unloaded", {})
    assert len(listener.health) == 2  # told on changes only
    broken.broken = False
    tee.record("m", 2, "version_activated", {})
    assert broken.seen == ["version_activated"]
    assert tee.failing() == {}
    assert listener.health[-1] == {}


def test_tee_replays_fault_events_to_a_sink_added_later() -> None:
    tee = EventTee(Events())
    tee.record("*", None, "canary_state_corrupt", {"reason": "bad"})
    tee.record("m", 1, "version_activated", {})
    late = Events()
    tee.add(late)
    assert late.kinds() == ["canary_state_corrupt"]  # faults only: the rest was told live


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[ModelCache]:
    """Version 1 (active) and 2 (ready) of model m."""
    for version in (1, 2):
        write_model(tmp_path / f"src{version}", "m", mlp_model(seed=version), CONFIG, (version,))
    opened = ModelCache(tmp_path / "cache")
    opened.install("m", 1, tmp_path / "src1/m")
    opened.activate("m", 1)
    opened.install("m", 2, tmp_path / "src2/m")
    yield opened
    opened.close()


@pytest.fixture
def served(cache: ModelCache) -> Iterator[ModelRegistry]:
    reg = ModelRegistry(
        cache.repository_path, LoadSettings(intra_op_threads=1), ledger=MemoryLedger(4 << 30)
    )
    assert reg.load_all() == {}
    yield reg
    reg.close()


def ledger_keys(registry: ModelRegistry) -> set[tuple[str, str]]:
    assert registry.ledger is not None
    return {key for key in registry.ledger.reserved() if key[0] == "m"}


def test_failing_sink_cannot_break_or_leak_a_hot_swap(
    cache: ModelCache, served: ModelRegistry
) -> None:
    broken, seen = Broken(), Events()
    manager = ModelManager(served, EventTee(broken, CacheEvents(cache), seen))
    versions = CachedVersions(cache, manager)
    old = ledger_keys(served)
    assert len(old) == 1

    asyncio.run(versions.activate("m", 2))

    assert [s.versions.keys() for s in served.served_models()] == [{2}]
    new = ledger_keys(served)
    assert len(new) == 1
    assert not new & old  # the old version gave its memory back: released
    assert seen.kinds() == ["version_activated"]
    assert manager.events.failing() == {"Broken": "OSError: [Errno 28] No space left on device"}
    assert "version_activated" in [e.kind for e in cache.events()]


def test_a_bare_failing_sink_is_guarded_too(cache: ModelCache, served: ModelRegistry) -> None:
    manager = ModelManager(served, Broken())
    asyncio.run(manager.load("m", source=cache.get("m", 2).path))
    assert [s.versions.keys() for s in served.served_models()] == [{2}]
    assert len(ledger_keys(served)) == 1
    assert list(manager.events.failing()) == ["Broken"]


def test_failed_cache_gc_is_an_event_and_the_swap_stands(
    cache: ModelCache, served: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: object, **_kw: object) -> NoReturn:
        raise CacheError("blob directory: I/O error")

    monkeypatch.setattr(model_cache.gc, "collect", fail)  # cache_control imports it per call
    seen = Events()
    versions = CachedVersions(cache, ModelManager(served, seen))
    asyncio.run(versions.activate("m", 2))  # does not raise
    assert seen.kinds() == ["version_activated", "cache_gc_failed"]
    assert seen.seen[-1] == ("*", None, "cache_gc_failed", {"reason": "blob directory: I/O error"})
    assert [s.versions.keys() for s in served.served_models()] == [{2}]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ModelRegistry]:
    """Versions 1 and 2 of model m, for canaries."""
    write_versions(tmp_path / "models", "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    reg = ModelRegistry(tmp_path / "models", LoadSettings(intra_op_threads=1))
    assert reg.load_all() == {}
    yield reg
    reg.close()


def test_corrupt_canary_state_is_an_event(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    for text in ("{not json", '{"schema": 1, "models": []}', '{"schema": 7}'):
        state.write_text(text)
        events = Events()
        manager = CanaryManager(registry, events, state_path=state)
        [(model, version, kind, detail)] = events.seen
        assert (model, version, kind) == ("*", None, "canary_state_corrupt")
        assert detail["path"] == str(state)
        assert detail["reason"]
        assert manager.route("m") is None  # serving goes on without it


def test_failed_canary_state_write_is_an_event(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    events = Events()
    manager = CanaryManager(registry, events, state_path=state)
    state.mkdir()  # the file cannot be replaced now
    promote(manager)
    failed = [s for s in events.seen if s[2] == "canary_state_write_failed"]
    assert failed, events.kinds()
    assert failed[0][3]["path"] == str(state)
    assert failed[0][3]["models"] == ["m"]
    assert "canary_promoted" in events.kinds()
    assert manager.route("m") == 2  # the verdict holds in memory
    state.rmdir()
    manager.stop("m")  # the next change writes the file again
    assert json.loads(state.read_text())["models"]["m"]["pin"] is None


def test_a_failing_sink_never_fails_a_canary_verdict(registry: ModelRegistry) -> None:
    manager = CanaryManager(registry, Broken())
    promote(manager)  # records canary_started and canary_promoted into a failing sink
    assert manager.status("m")["state"] == "PROMOTED"
    assert manager.route("m") == 2
