"""Rebirth requests are paced, never dropped (`agent.fleet.rebirth`)."""

from __future__ import annotations

import pytest

from agent.fleet.rebirth import RebirthPacer


def test_the_first_request_is_answered_at_once() -> None:
    pacer = RebirthPacer()
    assert pacer.request(100.0) == 0.0
    assert pacer.request(101.5) == 0.0  # past the interval: at once again


def test_requests_inside_the_second_are_answered_once_at_its_end() -> None:
    pacer = RebirthPacer()
    assert pacer.request(100.0) == 0.0
    assert pacer.request(100.25) == 0.75  # a manager that subscribed after the answer
    assert pacer.request(100.5) is None  # the scheduled answer covers it
    assert pacer.request(100.9) is None
    pacer.fired(101.0)
    assert pacer.request(101.2) == pytest.approx(0.8)
    pacer.fired(102.0)
    assert pacer.request(103.0) == 0.0
