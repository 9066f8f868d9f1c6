"""Pure rules: one failure, one notice; reminders spaced out; an end told once."""

from __future__ import annotations

from sync.notices import Notice, NoticeKind, Notices, Reminders


def kinds(notices: list[Notice]) -> list[tuple[str, str]]:
    return [(n.kind.value, n.key) for n in notices]


def test_a_failure_is_told_once_then_its_end_once() -> None:
    notices = Notices()
    assert kinds(notices.observe(0.0, {"*": "store down"})) == [("started", "*")]
    for t in range(1, 100):
        assert notices.observe(float(t), {"*": "store down"}) == []
    [ended] = notices.observe(100.0, {})
    assert (ended.kind, ended.reason, ended.since, ended.seen) == (
        NoticeKind.ENDED,
        "store down",
        0.0,
        100,
    )
    assert notices.observe(101.0, {}) == []
    assert notices.failing() == {}


def test_another_reason_is_a_new_failure() -> None:
    notices = Notices()
    notices.observe(0.0, {"m": "version 5 not signed"})
    [again] = notices.observe(1.0, {"m": "version 6 not signed"})
    assert (again.kind, again.reason) == (NoticeKind.STARTED, "version 6 not signed")


def test_reminders_back_off_and_are_off_by_default() -> None:
    notices = Notices(Reminders(first_s=10, max_s=40))
    notices.observe(0.0, {"*": "down"})
    told = [t for t in range(1, 200) if notices.observe(float(t), {"*": "down"})]
    assert told == [10, 30, 70, 110, 150, 190]  # after 10, 20, 40, then 40 (the cap)
    quiet = Notices()
    quiet.observe(0.0, {"*": "down"})
    assert all(quiet.observe(float(t), {"*": "down"}) == [] for t in range(1, 10_000, 97))


def test_scope_leaves_other_keys_alone() -> None:
    notices = Notices()
    notices.observe(0.0, {"*": "down", "m": "pinned version not signed"})
    assert notices.observe(1.0, {}, scope=lambda key: key == "*") == [
        Notice(NoticeKind.ENDED, "*", "down", 0.0, 1)
    ]
    assert notices.failing() == {"m": "pinned version not signed"}


def test_without_announce_only_reminders_are_told() -> None:
    notices = Notices(Reminders(first_s=5))
    assert notices.observe(0.0, {"m/2": "bad"}, announce=False) == []
    assert kinds(notices.observe(5.0, {"m/2": "bad"}, announce=False)) == [("reminder", "m/2")]
    assert notices.observe(6.0, {}, announce=False) == []
