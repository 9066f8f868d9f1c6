"""The health state machine of a version's instances (pure): back-off, restart limit, readiness."""

from __future__ import annotations

from agent.backends.health import ChangeKind, RestartPolicy, VersionHealth

POLICY = RestartPolicy(backoff_s=0.5, backoff_max_s=4.0, restart_limit=3, reset_after_s=60.0)


def test_the_back_off_doubles_up_to_its_cap() -> None:
    assert [POLICY.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_failed_instance_is_down_at_once_and_up_after_its_restart() -> None:
    health = VersionHealth(["m_0", "m_1"], POLICY, now=0.0)
    assert health.state.ready
    assert health.state.live == 2
    assert health.state.reason == ""
    change = health.failed(0, "worker (pid 7) killed by signal 9", now=10.0)
    assert change is not None
    assert (change.kind, change.instance, change.live, change.restart_in_s) == (
        ChangeKind.FAILED,
        "m_0",
        1,
        0.5,
    )
    assert health.state.ready  # one instance still serves
    assert health.state.reason.startswith("1 of 2 instances down: instance m_0 down")
    assert "killed by signal 9" in health.state.reason
    assert health.next_due() == 10.5
    assert health.due(10.4) == []
    assert health.due(10.5) == [0]
    assert health.next_due() is None  # restarting: nothing else is due
    assert "restarting" in health.state.reason
    back = health.restarted(0, now=12.0)
    assert back is not None
    assert back.kind is ChangeKind.RESTARTED
    assert back.live == 2
    assert health.state.ready
    assert health.state.reason == ""


def test_no_instance_left_is_not_ready() -> None:
    health = VersionHealth(["m_0"], POLICY, now=0.0)
    health.failed(0, "worker exited with code 3", now=1.0)
    assert not health.state.ready
    assert health.state.reason.startswith("no instance is serving: instance m_0 down")


def test_a_failure_is_told_once() -> None:
    health = VersionHealth(["m_0"], POLICY, now=0.0)
    assert health.failed(0, "first", now=1.0) is not None
    assert health.failed(0, "again", now=1.1) is None  # DOWN already: nothing new


def test_consecutive_failures_back_off_then_give_up_once() -> None:
    health = VersionHealth(["m_0"], POLICY, now=0.0)
    delays = []
    now = 1.0
    change = health.failed(0, "killed", now)
    while change is not None and change.kind is ChangeKind.FAILED:
        assert change.restart_in_s is not None
        delays.append(change.restart_in_s)
        now += change.restart_in_s
        assert health.due(now) == [0]
        change = health.restart_failed(0, "initialize raised RuntimeError: no weights", now)
    assert delays == [0.5, 1.0, 2.0]  # three restarts (the limit), each after a longer wait
    assert change is not None
    assert change.kind is ChangeKind.GAVE_UP
    assert change.failures == 4
    assert "failed 4 time(s) in a row (3 restart(s))" in change.reason
    assert "no weights" in change.reason
    assert health.gave_up == change.reason
    assert not health.state.ready
    assert health.state.reason == change.reason
    assert health.next_due() is None
    assert health.due(now + 100) == []
    assert health.failed(0, "later", now + 200) is None  # no more changes: no storm


def test_an_instance_that_served_long_enough_starts_counting_again() -> None:
    health = VersionHealth(["m_0"], POLICY, now=0.0)
    now = 0.0
    for _ in range(3):  # three failures, each soon after its restart
        change = health.failed(0, "killed", now)
        assert change is not None
        assert change.kind is ChangeKind.FAILED
        now += 10.0
        health.due(now)
        health.restarted(0, now)
    # Up for longer than reset_after_s: the next failure is the first of a new run.
    change = health.failed(0, "killed", now + 61.0)
    assert change is not None
    assert change.kind is ChangeKind.FAILED
    assert change.failures == 1
    assert change.restart_in_s == 0.5


def test_restart_limit_zero_gives_up_at_the_first_failure() -> None:
    policy = RestartPolicy(restart_limit=0)
    health = VersionHealth(["m_0", "m_1"], policy, now=0.0)
    change = health.failed(1, "hung: no heartbeat answer within 10 s", now=1.0)
    assert change is not None
    assert change.kind is ChangeKind.GAVE_UP
    assert "(restarts are off)" in change.reason
    assert not health.state.ready  # the whole version gives up, its other instance too


def test_a_change_detail_is_an_events_detail() -> None:
    health = VersionHealth(["m_0"], POLICY, now=0.0)
    change = health.failed(0, "killed by signal 9", now=1.0)
    assert change is not None
    assert change.kind.value == "instance_failed"
    assert change.detail() == {
        "instance": "m_0",
        "live": 0,
        "instances": 1,
        "ready": False,
        "reason": "killed by signal 9",
        "failures": 1,
        "restart_in_s": 0.5,
    }
