"""The canary core: routing shares, promotion, rollback with figures, states, policy checks."""

from __future__ import annotations

import math
import random

import pytest

from agent.canary.policy import (
    Action,
    Canary,
    CanaryPolicy,
    CanaryPolicyError,
    CanaryState,
    CanaryStateError,
    parse_policy,
)


def test_share_of_seeded_draws_within_five_sigma() -> None:
    # Each draw goes to the candidate with probability `share`: the count is binomial(n, share).
    # Five standard deviations either side of the mean: a correct router fails this once in
    # ~1.7 million seeds, while a router off by 2 points (0.08 or 0.12) fails it every time.
    n, share = 10_000, 0.1
    canary = Canary(CanaryPolicy(candidate=2, share=share), baseline=1)
    rng = random.Random(1234)
    to_candidate = sum(canary.route(rng.random()) == 2 for _ in range(n))
    sigma = math.sqrt(n * share * (1 - share))
    assert abs(to_candidate - n * share) <= 5 * sigma, to_candidate


def test_route_edges() -> None:
    canary = Canary(CanaryPolicy(candidate=3, share=0.25), baseline=1)
    assert canary.route(0.0) == 3
    assert canary.route(0.2499) == 3
    assert canary.route(0.25) == 1
    assert canary.route(0.9999) == 1
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="draw"):
            canary.route(bad)


def test_promoted_after_exactly_n_good_requests() -> None:
    canary = Canary(CanaryPolicy(candidate=2, share=0.5, promote_after=50, window=10), baseline=1)
    for i in range(49):
        assert canary.record(2, ok=True, latency_us=100 + i) is None
        assert canary.record(1, ok=False, latency_us=5) is None  # the baseline is never judged
    decision = canary.record(2, ok=True, latency_us=100)
    assert decision is not None
    assert decision.action is Action.PROMOTE
    assert decision.good_requests == 50
    assert (decision.window.requests, decision.window.errors) == (10, 0)
    assert canary.state is CanaryState.PROMOTED
    assert canary.decision == decision
    assert decision.as_json()["good_requests"] == 50


def test_failures_do_not_count_towards_promotion() -> None:
    policy = CanaryPolicy(candidate=2, share=0.5, promote_after=20, window=20, max_error_rate=0.5)
    canary = Canary(policy, baseline=1)
    for _ in range(5):
        assert canary.record(2, ok=False, latency_us=10) is None
    for _ in range(19):
        assert canary.record(2, ok=True, latency_us=10) is None
    decision = canary.record(2, ok=True, latency_us=10)
    assert decision is not None
    assert decision.action is Action.PROMOTE
    assert decision.window.errors == 0  # the early failures slid out of the 20-request window


def test_rollback_on_error_rate_with_figures() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=100, max_error_rate=0.05)
    canary = Canary(policy, baseline=1)
    decisions = []
    for i in range(100):
        decisions.append(canary.record(2, ok=i % 10 >= 3, latency_us=1000))  # 30% fail
    assert decisions[:99] == [None] * 99  # nothing is judged before the window is full
    decision = decisions[99]
    assert decision is not None
    assert decision.action is Action.ROLLBACK
    assert (decision.window.requests, decision.window.errors) == (100, 30)
    assert decision.window.error_rate == pytest.approx(0.30)
    assert decision.reason == "error rate 0.30 over the last 100 requests > 0.05"
    detail = decision.as_json()
    assert detail["action"] == "ROLLBACK"
    assert (detail["candidate"], detail["baseline"]) == (2, 1)
    assert (detail["error_rate"], detail["max_error_rate"]) == (0.3, 0.05)
    assert canary.state is CanaryState.ROLLED_BACK


def test_rollback_on_p95_latency() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=20, max_p95_us=5000)
    canary = Canary(policy, baseline=1)
    # 18 fast, 2 slow: the nearest-rank p95 of 20 is the 19th value, a slow one.
    latencies = [1000] * 18 + [9000, 9500]
    results = [canary.record(2, ok=True, latency_us=us) for us in latencies]
    decision = results[-1]
    assert results[:-1] == [None] * 19
    assert decision is not None
    assert decision.action is Action.ROLLBACK
    assert decision.window.p95_us == 9000
    assert decision.max_p95_us == 5000
    assert decision.reason == "p95 9000 us over the last 20 requests > 5000 us"


def test_p95_under_the_limit_does_not_roll_back() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=20, promote_after=20, max_p95_us=5000)
    canary = Canary(policy, baseline=1)
    latencies = [1000] * 19 + [9000]  # one slow request of 20 is the p100, not the p95
    results = [canary.record(2, ok=True, latency_us=us) for us in latencies]
    assert results[-1] is not None
    assert results[-1].action is Action.PROMOTE
    assert results[-1].window.p95_us == 1000


def test_min_requests_judges_before_the_window_is_full() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=100, min_requests=10)
    canary = Canary(policy, baseline=1)
    results = [canary.record(2, ok=False, latency_us=1) for _ in range(10)]
    assert results[:9] == [None] * 9
    assert results[9] is not None
    assert results[9].window.requests == 10


def test_wrong_state_calls_raise() -> None:
    canary = Canary(CanaryPolicy(candidate=2, share=0.5, promote_after=1, window=1), baseline=1)
    assert canary.record(2, ok=True, latency_us=1) is not None
    with pytest.raises(CanaryStateError, match="PROMOTED"):
        canary.route(0.1)
    with pytest.raises(CanaryStateError, match="PROMOTED"):
        canary.record(2, ok=True, latency_us=1)
    with pytest.raises(CanaryStateError, match="PROMOTED"):
        canary.stop()
    stopped = Canary(CanaryPolicy(candidate=2, share=0.5), baseline=1)
    stopped.record(2, ok=False, latency_us=7)
    figures = stopped.stop()
    assert (figures.requests, figures.errors, figures.p95_us) == (1, 1, 7)
    assert stopped.state is CanaryState.STOPPED
    with pytest.raises(CanaryStateError, match="STOPPED"):
        stopped.route(0.5)


def test_record_of_an_unrelated_version_raises() -> None:
    canary = Canary(CanaryPolicy(candidate=2, share=0.5), baseline=1)
    with pytest.raises(ValueError, match="neither"):
        canary.record(3, ok=True, latency_us=1)
    with pytest.raises(ValueError, match="latency"):
        canary.record(2, ok=True, latency_us=-1)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"share": 0.0}, "share"),
        ({"share": 1.0}, "share"),
        ({"share": 1.5}, "share"),
        ({"share": float("nan")}, "share"),
        ({"candidate": 0}, "version"),
        ({"candidate": True}, "version"),
        ({"promote_after": 0}, "promote_after"),
        ({"window": 0}, "window"),
        ({"window": 10**9}, "window"),
        ({"max_error_rate": 1.0}, "max_error_rate"),
        ({"max_error_rate": -0.1}, "max_error_rate"),
        ({"max_p95_us": 0}, "max_p95_us"),
        ({"min_requests": 101}, "min_requests"),
        ({"promote_after": 50}, "promote_after"),  # below the window of 100: never judged
    ],
)
def test_bad_policies_refused(kwargs: dict[str, object], key: str) -> None:
    args: dict[str, object] = {"candidate": 2, "share": 0.1, **kwargs}
    with pytest.raises(CanaryPolicyError) as caught:
        CanaryPolicy(**args)  # type: ignore[arg-type]
    assert caught.value.key == key


def test_candidate_equal_to_baseline_refused() -> None:
    with pytest.raises(CanaryPolicyError, match="also the baseline"):
        Canary(CanaryPolicy(candidate=2, share=0.1), baseline=2)


def test_parse_policy_wire_form() -> None:
    policy = parse_policy(
        {"version": 2, "share": 0.1, "promote_after": 200, "window": 50, "max_p95_ms": 12.5}
    )
    assert policy == CanaryPolicy(2, 0.1, 200, 50, 0.05, 12_500, None)
    assert parse_policy(policy.as_json()) == policy
    assert parse_policy({**policy.as_json(), "min_requests": 5}).judged_after == 5


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"share": 0.1}, "version"),
        ({"version": 2}, "share"),
        ({"version": "2", "share": 0.1}, "version"),
        ({"version": 2.0, "share": 0.1}, "version"),
        ({"version": 2, "share": "0.1"}, "share"),
        ({"version": 2, "share": 0.1, "max_p95_ms": 0}, "max_p95_ms"),
        ({"version": 2, "share": 0.1, "max_p95_ms": True}, "max_p95_ms"),
        ({"version": 2, "share": 0.1, "colour": "red"}, "colour"),
    ],
)
def test_parse_policy_names_the_bad_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(CanaryPolicyError) as caught:
        parse_policy(doc)
    assert caught.value.key == key


def test_each_version_has_its_own_window() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=10, promote_after=1000, max_p95_us=500)
    canary = Canary(policy, baseline=1)
    for latency in range(100, 1000, 100):  # 9 requests, 100..900 us: not judged yet
        assert canary.record(2, ok=True, latency_us=latency) is None
    assert canary.figures(2).p95_us == 900
    for _ in range(10):  # the baseline has its own window
        canary.record(1, ok=True, latency_us=10_000)
    assert canary.figures(1).p95_us == 10_000
    assert canary.figures(2).requests == 9


def test_old_latencies_leave_the_window() -> None:
    policy = CanaryPolicy(candidate=2, share=0.1, window=4, promote_after=1000, max_error_rate=0.9)
    canary = Canary(policy, baseline=1)
    for latency in (9000, 8000, 7000, 6000, 10, 20, 30):
        canary.record(2, ok=True, latency_us=latency)
    seen = canary.figures(2)
    assert (seen.requests, seen.p95_us) == (4, 6000)
    canary.record(2, ok=True, latency_us=40)
    assert canary.figures(2).p95_us == 40
