"""Readiness follows the instances: the registry on generated ONNX models, each version's health
set through its `monitor` (the `ReportsHealth` seam the backends fill), and strict readiness."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from agent.backends.health import ChangeKind, HealthChange, HealthState
from agent.errors import ModelNotReadyError, NoReadyVersionError
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from tests.models import VERSIONED_CONFIG, scale_model, write_versions

DOWN = HealthState(1, 0, ("instance m_0 down (worker (pid 7) killed by signal 9); restart 1",))
HALF = HealthState(2, 1, ("instance m_1 down (hung: no heartbeat answer within 10 s)",))
UP = HealthState(1, 1)


class Monitor:
    """A version's health as its backend would report it."""

    def __init__(self, state: HealthState) -> None:
        self.health = state


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, int | None, str, dict[str, object]]] = []

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        self.recorded.append((model, version, kind, dict(detail)))


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ModelRegistry]:
    root = tmp_path / "models"
    write_versions(root, "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    write_versions(root, "n", {1: scale_model(3.0)})
    reg = ModelRegistry(root, LoadSettings(intra_op_threads=1))
    assert reg.load_all() == {}
    yield reg
    reg.close()


def watch(registry: ModelRegistry, model: str, version: int, state: HealthState) -> Monitor:
    """Give a served version a monitor saying `state` (as a backend's health would)."""
    served = next(s for s in registry.served_models() if s.name == model)
    monitor = Monitor(state)
    served.versions[version].monitor = monitor
    return monitor


def rows(registry: ModelRegistry) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["name"], r.get("version", "")): r for r in registry.index()}


def test_a_version_without_a_serving_instance_is_not_ready_until_one_is_back(
    registry: ModelRegistry,
) -> None:
    monitor = watch(registry, "m", 2, DOWN)
    # An unversioned request goes to the newest version that serves; the down one is refused.
    assert registry.resolve("m", None)[1] == 1
    with pytest.raises(ModelNotReadyError, match="version 2 is not at ready state") as refused:
        registry.resolve("m", "2")
    assert "no instance is serving: instance m_0 down" in refused.value.message
    row = rows(registry)[("m", "2")]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"].startswith("no instance is serving: instance m_0 down")
    assert rows(registry)[("m", "1")]["state"] == "READY"
    assert not registry.all_ready()
    monitor.health = UP  # no reload: it serves again as soon as an instance is back
    assert registry.resolve("m", "2")[1] == 2
    assert registry.resolve("m", None)[1] == 2
    assert rows(registry)[("m", "2")] == {
        "name": "m",
        "version": "2",
        "state": "READY",
        "reason": "",
    }
    assert registry.all_ready()


def test_no_version_serving_has_no_available_versions_with_why(registry: ModelRegistry) -> None:
    watch(registry, "m", 1, DOWN)
    watch(registry, "m", 2, DOWN)
    with pytest.raises(NoReadyVersionError, match="has no available versions") as refused:
        registry.resolve("m", None)
    assert "version 1: no instance is serving" in refused.value.message
    assert "version 2: no instance is serving" in refused.value.message
    assert registry.resolve("n", None)[1] == 1  # another model serves on


def test_a_version_with_an_instance_down_serves_and_says_which(registry: ModelRegistry) -> None:
    watch(registry, "m", 2, HALF)
    assert registry.resolve("m", "2")[1] == 2
    row = rows(registry)[("m", "2")]
    assert row["state"] == "READY"
    assert row["reason"].startswith("1 of 2 instances down: instance m_1 down (hung")
    assert registry.all_ready()


def test_strict_readiness_counts_failed_loads_and_not_unloads(tmp_path: Path) -> None:
    root = tmp_path / "models"
    write_versions(root, "m", {1: scale_model(1.0)})
    write_versions(root, "bad", {1: scale_model(1.0)})
    (root / "bad" / "config.pbtxt").write_text(
        VERSIONED_CONFIG.format(name="bad").replace("TYPE_FP32", "TYPE_INT32", 1)
    )
    registry = ModelRegistry(root, LoadSettings(intra_op_threads=1))
    try:
        assert set(registry.load_all()) == {"bad"}
        assert not registry.all_ready()  # a model the repository holds failed to load
        registry.unload("bad")
        assert registry.all_ready()  # "unloaded" on purpose is fine (Triton's rule)
        registry.mark_failed("m", 1, "instance m_0 failed 6 time(s) in a row")
        assert not registry.all_ready()
    finally:
        registry.close()


def test_instance_changes_are_events_and_giving_up_takes_the_version_out(
    registry: ModelRegistry,
) -> None:
    events = Events()
    registry.events = events
    served = next(s for s in registry.served_models() if s.name == "m")
    build = served.versions[2].build_id
    failed = HealthChange(ChangeKind.FAILED, "m_0", "killed by signal 9", 0, 1, 1, 0.5)
    registry.health_changed("m", 2, build, failed)
    assert events.recorded == [("m", 2, "instance_failed", failed.detail())]
    assert registry.resolve("m", "2")[1] == 2  # still served: its backend restarts it
    reason = "instance m_0 failed 6 time(s) in a row (5 restart(s)), the last: killed"
    gave_up = HealthChange(ChangeKind.GAVE_UP, "m_0", reason, 0, 1, 6)
    registry.health_changed("m", 1, "1@999", gave_up)  # another build: not the served one
    assert registry.resolve("m", "1")[1] == 1
    registry.health_changed("m", 2, build, gave_up)
    assert [e[2] for e in events.recorded] == ["instance_failed", "crash_loop", "crash_loop"]
    with pytest.raises(ModelNotReadyError, match="not at ready state"):
        registry.resolve("m", "2")
    assert rows(registry)[("m", "2")] == {
        "name": "m",
        "version": "2",
        "state": "UNAVAILABLE",
        "reason": reason,
    }
    assert registry.resolve("m", None)[1] == 1
