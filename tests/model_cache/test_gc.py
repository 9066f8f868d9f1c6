"""Garbage collection: retention per model, LRU eviction under a budget, protected versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_cache import (
    FaultHook,
    InstalledVersion,
    ModelCache,
    VersionNotFoundError,
    VersionState,
    budget_order,
    collect,
    plan_retention,
)
from tests.model_cache.support import MakeSource, OpenCache, served, tamper

A, R, F, S, Y = (
    VersionState.ACTIVE,
    VersionState.RETIRED,
    VersionState.FAILED,
    VersionState.STAGED,
    VersionState.READY,
)


def record(model: str, version: int, state: VersionState, last_used: float) -> InstalledVersion:
    return InstalledVersion(
        model=model,
        version=version,
        digest="0" * 64,
        state=state,
        reason="broken" if state is F else None,
        path=Path("/nowhere"),
        created_at=0.0,
        activated_at=None,
        last_used=last_used,
    )


def ids(plan: list[tuple[InstalledVersion, str]]) -> list[tuple[str, int]]:
    return [(v.model, v.version) for v, _why in plan]


# The pure policy ------------------------------------------------------------------------


def test_plan_keeps_active_and_the_last_n_retained() -> None:
    versions = [record("m", v, R, float(v)) for v in (1, 2, 3, 4)] + [record("m", 5, A, 0.0)]

    assert ids(plan_retention(versions, keep_last=2)) == [("m", 1), ("m", 2)]
    assert ids(plan_retention(versions, keep_last=0)) == [("m", 1), ("m", 2), ("m", 3), ("m", 4)]
    assert ids(plan_retention(versions, keep_last=10)) == []


def test_plan_orders_by_recency_not_version_number() -> None:
    versions = [record("m", 1, R, 30.0), record("m", 2, R, 10.0), record("m", 3, Y, 20.0)]

    assert ids(plan_retention(versions, keep_last=1)) == [("m", 2), ("m", 3)]


def test_plan_counts_per_model() -> None:
    versions = [record("a", 1, R, 1.0), record("a", 2, R, 2.0), record("b", 1, R, 0.5)]

    assert ids(plan_retention(versions, keep_last=1)) == [("a", 1)]


def test_plan_evicts_failed_first_and_never_active_staged_or_protected() -> None:
    versions = [
        record("m", 1, R, 1.0),
        record("m", 2, F, 9.0),
        record("m", 3, A, 0.0),
        record("m", 4, S, 0.0),
        record("m", 5, R, 2.0),
    ]

    plan = plan_retention(versions, keep_last=0, protected={("m", 5)})

    assert ids(plan) == [("m", 2), ("m", 1)]
    assert plan[0][1] == "failed: broken"


def test_plan_rejects_a_negative_keep_last() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        plan_retention([], keep_last=-1)


def test_budget_order_is_least_recently_used_first_across_models() -> None:
    versions = [
        record("a", 1, R, 5.0),
        record("b", 1, Y, 1.0),
        record("b", 2, A, 0.0),
        record("a", 2, R, 3.0),
        record("c", 1, R, 0.1),
    ]

    order = budget_order(versions, protected={("c", 1)})

    assert [(v.model, v.version) for v in order] == [("b", 1), ("a", 2), ("a", 1)]


# Collecting a real cache ------------------------------------------------------------------


def install_chain(cache: ModelCache, src: MakeSource, model: str, count: int, size: int) -> None:
    """Install and activate versions 1..count of a model, each with its own model file."""
    for version in range(1, count + 1):
        payload = f"{model}{version}".encode().ljust(size, b".")
        cache.install(model, version, src(version, {"model.onnx": payload}, model=model))
        cache.activate(model, version)


def test_collect_keeps_active_and_last_n(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "m", 4, 100)
    folders = {v.version: v.path for v in cache.list_versions("m")}
    blobs_before = len(cache.blobs.digests())

    report = collect(cache, keep_last=1)

    assert [(m, v) for m, v, _why in report.evicted] == [("m", 1), ("m", 2)]
    assert [v.version for v in cache.list_versions("m")] == [3, 4]
    assert not folders[1].exists()
    assert not folders[2].exists()
    assert folders[3].is_dir()
    assert report.removed_blobs == 2  # the two model files; the shared config stays
    assert len(cache.blobs.digests()) == blobs_before - 2
    assert report.freed_bytes == 200
    assert report.bytes_after == report.bytes_before - 200
    assert served(cache) == {"m": {4: b"m4".ljust(100, b".")}}
    assert [e.kind for e in cache.events()].count("evicted") == 2
    with pytest.raises(VersionNotFoundError):
        cache.rollback("m", to_version=1)
    assert cache.rollback("m").version == 3


def test_collect_respects_the_protected_set(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "m", 3, 10)

    report = collect(cache, keep_last=0, protected={("m", 1)})

    assert [(m, v) for m, v, _why in report.evicted] == [("m", 2)]
    assert [v.version for v in cache.list_versions("m")] == [1, 3]


def test_touch_changes_what_is_least_recently_used(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "m", 3, 10)
    cache.touch("m", 1)

    collect(cache, keep_last=1)

    assert [v.version for v in cache.list_versions("m")] == [1, 3]


def test_budget_evicts_lru_across_models_until_it_fits(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "a", 3, 1_000)  # a1, a2 retired (a1 older)
    install_chain(cache, src, "b", 2, 1_000)  # b1 retired, most recent of the retired
    usage = cache.disk_usage()

    report = collect(cache, keep_last=5, disk_budget_bytes=usage - 1_500)

    assert [(m, v) for m, v, _why in report.evicted] == [("a", 1), ("a", 2)]
    assert all("budget" in why for _m, _v, why in report.evicted)
    assert not report.over_budget
    assert report.bytes_after <= usage - 1_500
    assert {m: set(vs) for m, vs in served(cache).items()} == {"a": {3}, "b": {2}}
    assert [v.version for v in cache.list_versions("b")] == [1, 2]


def test_budget_never_evicts_active_or_protected(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "m", 2, 1_000)

    report = collect(cache, keep_last=5, disk_budget_bytes=10, protected={("m", 1)})

    assert report.evicted == ()
    assert report.over_budget
    assert [v.version for v in cache.list_versions("m")] == [1, 2]
    assert served(cache) == {"m": {2: b"m2".ljust(1_000, b".")}}


def test_collect_evicts_failed_versions(cache: ModelCache, src: MakeSource) -> None:
    install_chain(cache, src, "m", 2, 10)
    v1 = cache.get("m", 1)
    tamper(v1.version_dir / "model.onnx", b"bad")
    assert not cache.verify("m", 1)

    report = collect(cache, keep_last=5)

    assert [(m, v) for m, v, _why in report.evicted] == [("m", 1)]
    assert report.evicted[0][2].startswith("failed: ")
    assert not v1.path.exists()


def test_collect_removes_blobs_left_by_a_crashed_install(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache()
    install_chain(cache, src, "m", 1, 10)

    def crash(step: str) -> None:
        if step == "blobs-written":
            raise RuntimeError(step)

    hook: FaultHook = crash
    with pytest.raises(RuntimeError):
        cache.install("m", 2, src(2, {"model.onnx": b"orphan bytes"}), fault=hook)
    cache.close()
    cache = open_cache()
    before = set(cache.blobs.digests())

    report = collect(cache, keep_last=5)

    assert report.removed_blobs == 1
    assert report.freed_bytes == len(b"orphan bytes")
    assert len(before - set(cache.blobs.digests())) == 1
    assert served(cache) == {"m": {1: b"m1".ljust(10, b".")}}


def test_after_collect_a_restart_finds_nothing_to_repair(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache()
    install_chain(cache, src, "m", 4, 10)
    collect(cache, keep_last=1, disk_budget_bytes=10_000)
    cache.close()

    report = open_cache().last_recovery

    assert report.removed_orphans == ()
    assert report.failed == ()
    assert not report.view_rebuilt


def test_collect_rejects_a_negative_budget(cache: ModelCache) -> None:
    with pytest.raises(ValueError, match="budget"):
        collect(cache, keep_last=1, disk_budget_bytes=-1)
