"""Triton statistics extension: exact counters, JSON shape, filters, windows, thread safety."""

from __future__ import annotations

import json
import math
import threading

import pytest

from agent.scheduling.statistics import QUANTILES, ModelStatistics, StatisticsRegistry


def _success(m: ModelStatistics, *, request: int, queue: int, now_ms: int = 1) -> None:
    m.record_success(
        request_ns=request,
        queue_ns=queue,
        compute_input_ns=10,
        compute_infer_ns=100,
        compute_output_ns=1,
        now_ms=now_ms,
    )


def _execute(m: ModelStatistics, batch_size: int, infer_ns: int = 100) -> None:
    m.record_execution(
        batch_size=batch_size, compute_input_ns=10, compute_infer_ns=infer_ns, compute_output_ns=1
    )


def test_counts_and_ns_sums_are_exact() -> None:
    m = ModelStatistics("mlp", "1")
    _success(m, request=1_000, queue=200, now_ms=50)
    _success(m, request=3_000, queue=400, now_ms=70)
    _execute(m, 2)
    m.record_failure(request_ns=500, reason="BACKEND", now_ms=90)
    doc = m.to_json()
    stats = doc["inference_stats"]
    assert doc["name"] == "mlp"
    assert doc["version"] == "1"
    assert doc["last_inference"] == 70
    assert doc["inference_count"] == 2
    assert doc["execution_count"] == 1
    assert stats["success"] == {"count": 2, "ns": 4_000}
    assert stats["fail"] == {"count": 1, "ns": 500}
    assert stats["queue"] == {"count": 2, "ns": 600}
    assert stats["compute_input"] == {"count": 2, "ns": 20}
    assert stats["compute_infer"] == {"count": 2, "ns": 200}
    assert stats["compute_output"] == {"count": 2, "ns": 2}
    assert stats["cache_hit"] == {"count": 0, "ns": 0}
    assert stats["cache_miss"] == {"count": 0, "ns": 0}


def test_an_execution_the_model_raised_in_has_no_inferences() -> None:
    """As Triton: it counts as an execution (and in batch_stats), its rows not as inferences."""
    m = ModelStatistics("py", "1")
    _execute(m, 1)
    m.record_execution(
        batch_size=2, compute_input_ns=0, compute_infer_ns=50, compute_output_ns=0, failed=True
    )
    doc = m.to_json()
    assert (doc["execution_count"], doc["inference_count"]) == (2, 1)
    assert [b["batch_size"] for b in doc["batch_stats"]] == [1, 2]


def test_batch_stats_per_batch_size_sorted() -> None:
    m = ModelStatistics("mlp", "1")
    _execute(m, 8, infer_ns=800)
    _execute(m, 1, infer_ns=100)
    _execute(m, 8, infer_ns=700)
    doc = m.to_json()
    assert doc["execution_count"] == 3
    assert doc["inference_count"] == 17
    assert doc["batch_stats"] == [
        {
            "batch_size": 1,
            "compute_input": {"count": 1, "ns": 10},
            "compute_infer": {"count": 1, "ns": 100},
            "compute_output": {"count": 1, "ns": 1},
        },
        {
            "batch_size": 8,
            "compute_input": {"count": 2, "ns": 20},
            "compute_infer": {"count": 2, "ns": 1_500},
            "compute_output": {"count": 2, "ns": 2},
        },
    ]


def test_json_shape_matches_triton() -> None:
    m = ModelStatistics("mlp", "3")
    _execute(m, 1)
    doc = m.to_json()
    assert list(doc) == [
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "response_stats",
        "batch_stats",
        "memory_usage",
    ]
    assert set(doc["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert all(set(d) == {"count", "ns"} for d in doc["inference_stats"].values())
    assert set(doc["batch_stats"][0]) == {
        "batch_size",
        "compute_input",
        "compute_infer",
        "compute_output",
    }
    assert doc["response_stats"] == {}
    assert doc["memory_usage"] == []
    assert json.loads(json.dumps(doc)) == doc


def test_cache_hit_counts_success_but_not_inference_or_execution() -> None:
    m = ModelStatistics("mlp", "1")
    m.record_cache_hit(ns=300, now_ms=42, request_ns=2_000, queue_ns=100)
    m.record_cache_hit(ns=500, now_ms=43)
    doc = m.to_json()
    stats = doc["inference_stats"]
    assert stats["success"] == {"count": 2, "ns": 2_500}
    assert stats["queue"] == {"count": 2, "ns": 100}
    assert stats["cache_hit"] == {"count": 2, "ns": 800}
    assert stats["compute_infer"] == {"count": 0, "ns": 0}
    assert doc["inference_count"] == 0
    assert doc["execution_count"] == 0
    assert doc["last_inference"] == 43


def test_cache_miss_adds_to_request_duration_only() -> None:
    m = ModelStatistics("mlp", "1")
    _success(m, request=1_000, queue=0)
    m.record_cache_miss(ns=250)
    stats = m.to_json()["inference_stats"]
    assert stats["cache_miss"] == {"count": 1, "ns": 250}
    assert stats["success"] == {"count": 1, "ns": 1_250}


def test_failures_by_reason_and_last_inference_unmoved() -> None:
    m = ModelStatistics("mlp", "1")
    _success(m, request=1, queue=0, now_ms=10)
    m.record_failure(request_ns=5, reason="REJECTED", now_ms=99)
    m.record_failure(request_ns=5, reason="REJECTED", now_ms=99)
    m.record_failure(request_ns=5, reason="CANCELED", now_ms=99)
    snap = m.snapshot()
    assert dict(snap.failures) == {"REJECTED": 2, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert snap.stat("fail").count == 3
    assert snap.last_inference_ms == 10


def test_unknown_failure_reason_raises() -> None:
    m = ModelStatistics("mlp", "1")
    with pytest.raises(ValueError, match="unknown failure reason"):
        m.record_failure(request_ns=1, reason="TIMEOUT", now_ms=1)  # type: ignore[arg-type]
    assert m.snapshot().stat("fail").count == 0


def test_last_inference_keeps_the_latest_instant() -> None:
    m = ModelStatistics("mlp", "1")
    _success(m, request=1, queue=0, now_ms=200)
    _success(m, request=1, queue=0, now_ms=100)
    assert m.to_json()["last_inference"] == 200


def test_invalid_records_raise_and_change_nothing() -> None:
    m = ModelStatistics("mlp", "1")
    with pytest.raises(ValueError, match="queue_ns"):
        _success(m, request=10, queue=-1)
    with pytest.raises(ValueError, match="batch_size"):
        _execute(m, 0)
    with pytest.raises(ValueError, match="cache_miss_ns"):
        m.record_cache_miss(ns=-5)
    with pytest.raises(ValueError, match="window"):
        ModelStatistics("mlp", "1", window=0)
    doc = m.to_json()
    assert doc["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert doc["execution_count"] == 0


def test_pending_gauge() -> None:
    m = ModelStatistics("mlp", "1")
    m.pending_inc()
    m.pending_inc()
    m.pending_dec()
    assert m.snapshot().pending == 1
    m.pending_dec()
    m.pending_dec()
    assert m.snapshot().pending == 0
    m.set_pending(7)
    assert m.snapshot().pending == 7
    with pytest.raises(ValueError, match="pending"):
        m.set_pending(-1)


def test_quantiles_over_window_and_cumulative_count_sum() -> None:
    m = ModelStatistics("mlp", "1", window=100)
    for us in range(1, 101):  # queue 1..100 µs, all dropped from the window below
        _success(m, request=1_000, queue=us * 1_000)
    for us in range(1001, 1101):  # queue 1001..1100 µs
        _success(m, request=1_000, queue=us * 1_000)
    queue = m.snapshot().summary("queue")
    assert queue.count == 200
    assert queue.sum_us == sum(range(1, 101)) + sum(range(1001, 1101))
    assert dict(queue.quantiles) == {0.5: 1050.0, 0.9: 1090.0, 0.95: 1095.0, 0.99: 1099.0}


def test_quantiles_are_nan_while_empty() -> None:
    summary = ModelStatistics("mlp", "1").snapshot().summary("request")
    assert summary.count == 0
    assert [q for q, _ in summary.quantiles] == list(QUANTILES)
    assert all(math.isnan(v) for _, v in summary.quantiles)


def test_cache_hit_feeds_queue_summary_not_request_summary() -> None:
    m = ModelStatistics("mlp", "1")
    m.record_cache_hit(ns=1_000, now_ms=1, request_ns=9_000, queue_ns=4_000)
    snap = m.snapshot()
    assert snap.summary("queue").count == 1
    assert snap.summary("queue").sum_us == 4
    assert snap.summary("request").count == 0


def test_snapshot_is_a_frozen_copy() -> None:
    m = ModelStatistics("mlp", "1")
    before = m.snapshot()
    _success(m, request=10, queue=1)
    assert before.stat("success").count == 0
    assert m.snapshot().stat("success").count == 1


def test_registry_get_creates_once() -> None:
    reg = StatisticsRegistry()
    assert reg.get("a", "1") is reg.get("a", "1")
    assert reg.get("a", "1") is not reg.get("a", "2")


def test_registry_snapshot_sorted_and_filtered() -> None:
    reg = StatisticsRegistry()
    for name, version in [("b", "1"), ("a", "10"), ("a", "2"), ("a", "1")]:
        reg.get(name, version)
    rows = reg.snapshot()["model_stats"]
    assert [(r["name"], r["version"]) for r in rows] == [
        ("a", "1"),
        ("a", "2"),
        ("a", "10"),
        ("b", "1"),
    ]
    assert [r["version"] for r in reg.snapshot("a")["model_stats"]] == ["1", "2", "10"]
    only = reg.snapshot("a", "2")["model_stats"]
    assert [(r["name"], r["version"]) for r in only] == [("a", "2")]
    assert reg.snapshot("missing") == {"model_stats": []}
    assert reg.snapshot("b", "2") == {"model_stats": []}


def test_registry_remove_and_all() -> None:
    reg = StatisticsRegistry()
    _execute(reg.get("a", "1"), 1)
    reg.get("a", "2")
    reg.remove("a", "1")
    reg.remove("never", "1")
    assert [(m.name, m.version) for m in reg.all()] == [("a", "2")]
    assert reg.get("a", "1").to_json()["execution_count"] == 0


def test_registries_are_independent() -> None:
    one, two = StatisticsRegistry(), StatisticsRegistry()
    _execute(one.get("a", "1"), 4)
    assert two.snapshot() == {"model_stats": []}
    assert one.snapshot()["model_stats"][0]["inference_count"] == 4


def test_concurrent_records_total_exactly() -> None:
    reg = StatisticsRegistry(window=64)
    threads, per_thread = 8, 2_000
    start = threading.Barrier(threads)

    def work() -> None:
        start.wait()
        m = reg.get("mlp", "1")  # concurrent first use must still create a single instance
        for _ in range(per_thread):
            _success(m, request=3, queue=1)
            _execute(m, 2)
            m.record_failure(request_ns=1, reason="OTHER", now_ms=0)
            m.pending_inc()
            m.pending_dec()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    total = threads * per_thread
    (doc,) = reg.snapshot()["model_stats"]
    assert doc["inference_stats"]["success"] == {"count": total, "ns": 3 * total}
    assert doc["inference_stats"]["fail"] == {"count": total, "ns": total}
    assert doc["execution_count"] == total
    assert doc["inference_count"] == 2 * total
    assert doc["batch_stats"][0]["compute_infer"] == {"count": total, "ns": 100 * total}
    snap = reg.get("mlp", "1").snapshot()
    assert dict(snap.failures)["OTHER"] == total
    assert snap.pending == 0
    assert snap.summary("request").count == total
