"""Pure SLO and drift evaluation with injected time."""

from __future__ import annotations

import math

import pytest

from agent.fleet.slo import Sample, SloEvaluator, SloTarget, parse_slo_targets


def sample(
    ok: int, fail: int = 0, p95_ms: float = 1.0, queue_n: int = 0, queue_ms: float = 0.0
) -> Sample:
    return Sample("m", 1, ok, fail, p95_ms * 1000, math.nan, queue_n, int(queue_ms * 1e6))


def test_parse_targets() -> None:
    targets = parse_slo_targets(
        ["m:p95_ms=50,error_rate=0.001,window_s=30,min_requests=5", "*:p99_ms=9"]
    )
    assert targets == (
        SloTarget("m", p95_ms=50.0, error_rate=0.001, window_s=30.0, min_requests=5),
        SloTarget("*", p99_ms=9.0),
    )
    for bad in [
        "m",
        "m:p95=1",
        "m:p95_ms=x",
        "m:error_rate=2",
        "m:window_s=0",
        "bad name:p95_ms=1",
    ]:
        with pytest.raises(ValueError, match=r"\S"):
            parse_slo_targets([bad])
    with pytest.raises(ValueError, match="two entries"):
        parse_slo_targets(["m:p95_ms=1", "m:p99_ms=2"])


def test_latency_breach_is_edge_triggered_and_recovers() -> None:
    slo = SloEvaluator(parse_slo_targets(["m:p95_ms=50,min_requests=10"]))
    assert slo.evaluate(0.0, [sample(5, p95_ms=80)]) == []  # too few requests to judge
    breach = slo.evaluate(1.0, [sample(20, p95_ms=80)])
    assert [a.kind for a in breach] == ["slo_breach"]
    assert breach[0].figures["observed"] == 80.0
    assert breach[0].figures["target"] == 50.0
    assert slo.evaluate(2.0, [sample(40, p95_ms=90)]) == []  # still breached: no new event
    recovered = slo.evaluate(3.0, [sample(60, p95_ms=10)])
    assert [a.kind for a in recovered] == ["slo_recovered"]


def test_error_rate_over_the_window_only() -> None:
    slo = SloEvaluator(parse_slo_targets(["*:error_rate=0.1,window_s=10,min_requests=10"]))
    assert slo.evaluate(0.0, [sample(100, 50)]) != []  # 33% over its whole history
    slo = SloEvaluator(parse_slo_targets(["*:error_rate=0.1,window_s=10,min_requests=10"]))
    slo.evaluate(0.0, [sample(0, 0)])
    slo.evaluate(5.0, [sample(100, 0)])
    assert slo.evaluate(20.0, [sample(200, 5)]) == []  # 5 of 100 in the last window
    alerts = slo.evaluate(31.0, [sample(220, 25)])  # 20 of 40 since t=20
    assert [(a.kind, a.figures["failures"], a.figures["requests"]) for a in alerts] == [
        ("slo_breach", 20, 40)
    ]


def test_queue_drift_against_baseline() -> None:
    slo = SloEvaluator([SloTarget(drift_factor=3.0, drift_min_ms=1.0)])
    t, n, q = 0.0, 0, 0.0
    for _ in range(5):  # steady 2 ms mean queue time
        n, q, t = n + 10, q + 20.0, t + 1
        assert slo.evaluate(t, [sample(n, queue_n=n, queue_ms=q)]) == []
    n, q = n + 10, q + 200.0  # 20 ms per request
    drift = slo.evaluate(t + 1, [sample(n, queue_n=n, queue_ms=q)])
    assert [a.kind for a in drift] == ["queue_drift"]
    assert drift[0].figures["queue_us"] == 20000.0
    assert drift[0].figures["baseline_us"] == 2000.0
    n, q = n + 10, q + 20.0
    assert [a.kind for a in slo.evaluate(t + 2, [sample(n, queue_n=n, queue_ms=q)])] == [
        "queue_drift_recovered"
    ]


def test_unloaded_versions_are_forgotten() -> None:
    slo = SloEvaluator(parse_slo_targets(["m:p95_ms=1,min_requests=1"]))
    assert [a.kind for a in slo.evaluate(0.0, [sample(5, p95_ms=5)])] == ["slo_breach"]
    assert slo.evaluate(1.0, []) == []
    assert [a.kind for a in slo.evaluate(2.0, [sample(5, p95_ms=5)])] == ["slo_breach"]
