"""The send budget and stall clock both gRPC engines hold a connection's unsent answers with."""

from __future__ import annotations

from agent.api.grpc.sending import UNSENT_CAP, SendBudget, StallClock

MIB = 1024 * 1024


def run(budget: SendBudget, unsent: int = 0) -> int:
    """Start calls while the budget admits them; how many started."""
    started = 0
    while budget.admit(unsent):
        budget.started()
        started += 1
    return started


def test_a_few_calls_run_before_the_first_answer_tells_their_size() -> None:
    assert run(SendBudget(8 * MIB)) == 4


def test_large_answers_run_one_at_a_time_and_small_ones_many() -> None:
    budget = SendBudget(8 * MIB)
    budget.answered(4 * MIB)
    assert run(budget) == 2
    small = SendBudget(8 * MIB)
    for _ in range(20):
        small.answered(100)
    assert run(small) > 1000


def test_an_answer_over_the_cap_still_runs_alone() -> None:
    budget = SendBudget(8 * MIB)
    budget.answered(20 * MIB)
    assert budget.admit(0)
    budget.started()
    assert not budget.admit(0)
    budget.ended()
    assert budget.admit(0)


def test_unsent_bytes_at_the_cap_admit_nothing_until_they_drain() -> None:
    budget = SendBudget(8 * MIB)
    budget.answered(2 * MIB)
    assert not budget.admit(8 * MIB)
    assert run(budget, unsent=4 * MIB) == 2
    budget.ended()
    budget.ended()
    assert budget.admit(4 * MIB)


def test_the_estimate_follows_smaller_answers_halfway_and_larger_ones_at_once() -> None:
    budget = SendBudget(UNSENT_CAP)
    budget.answered(4 * MIB)
    budget.answered(0)
    assert budget.estimate == 2 * MIB
    budget.answered(3 * MIB)
    assert budget.estimate == 3 * MIB


def test_a_connection_is_stalled_after_the_timeout_without_progress() -> None:
    clock = StallClock(30.0)
    assert not clock.stalled(100.0, 5, backed_up=True)
    assert not clock.stalled(129.0, 5, backed_up=True)
    assert clock.stalled(130.0, 5, backed_up=True)


def test_progress_or_a_drained_look_starts_the_stall_clock_over() -> None:
    clock = StallClock(30.0)
    clock.stalled(0.0, 5, backed_up=True)
    assert not clock.stalled(20.0, 6, backed_up=True)  # the peer took a byte
    assert not clock.stalled(45.0, 6, backed_up=True)
    assert clock.stalled(50.0, 6, backed_up=True)
    other = StallClock(30.0)
    other.stalled(0.0, 5, backed_up=True)
    assert not other.stalled(20.0, 5, backed_up=False)  # under the cap: nothing to take
    assert not other.stalled(40.0, 5, backed_up=True)
    assert other.stalled(70.0, 5, backed_up=True)
