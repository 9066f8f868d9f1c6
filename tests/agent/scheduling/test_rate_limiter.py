"""Rate limiter: resources and weighted priority, driven without a scheduler."""

from __future__ import annotations

from agent.repository.model_config import parse_model_config
from agent.scheduling.rate_limiter import RateLimiter, ResourceNeed

HEAVY = ResourceNeed((("R", 4),), priority=2)
LIGHT = ResourceNeed((("R", 2),), priority=1)


def limiter() -> RateLimiter:
    lim = RateLimiter()
    lim.declare(HEAVY)
    lim.declare(LIGHT)
    return lim


def test_capacity_is_the_largest_declared_need() -> None:
    assert limiter().capacity == {"R": 4}


def test_override_sets_capacity() -> None:
    lim = RateLimiter()
    lim.declare(LIGHT, {"R": 10})
    assert lim.capacity == {"R": 10}


def test_no_resources_always_granted() -> None:
    lim = limiter()
    assert lim.try_acquire("a#1", HEAVY)
    assert lim.try_acquire("free#1", ResourceNeed())


def test_waits_until_resources_are_released() -> None:
    lim = limiter()
    assert lim.try_acquire("light#1", LIGHT)
    assert lim.try_acquire("light#2", LIGHT)
    assert not lim.try_acquire("heavy#1", HEAVY)
    assert lim.waiting == 1
    assert lim.release(LIGHT) == []  # 2 of 4 free: heavy needs 4
    assert lim.release(LIGHT) == ["heavy#1"]
    assert lim.waiting == 0


def test_priority_one_gets_twice_the_grants_of_priority_two() -> None:
    lim = RateLimiter(capacity={"R": 1})
    light = ResourceNeed((("R", 1),), priority=1)
    heavy = ResourceNeed((("R", 1),), priority=2)
    assert lim.try_acquire("holder#0", light)
    for i in range(30):
        lim.try_acquire(f"light#{i}", light)
        lim.try_acquire(f"heavy#{i}", heavy)
    granted: list[str] = []
    for _ in range(30):
        granted += lim.release(light if not granted or granted[-1].startswith("light") else heavy)
    lights = sum(1 for g in granted if g.startswith("light"))
    heavies = sum(1 for g in granted if g.startswith("heavy"))
    assert (lights, heavies) == (20, 10)


def test_heavy_model_cannot_starve_the_light_one() -> None:
    lim = RateLimiter(capacity={"R": 1})
    light = ResourceNeed((("R", 1),), priority=1)
    heavy = ResourceNeed((("R", 1),), priority=4)
    assert lim.try_acquire("heavy#0", heavy)
    for i in range(10):
        lim.try_acquire(f"heavy#{i + 1}", heavy)
    lim.try_acquire("light#0", light)
    assert lim.release(heavy) == ["light#0"]


def test_cancel_drops_a_waiter() -> None:
    lim = limiter()
    assert lim.try_acquire("heavy#1", HEAVY)
    assert not lim.try_acquire("light#1", LIGHT)
    lim.cancel("light#1")
    assert lim.release(HEAVY) == []


def test_need_from_config() -> None:
    config = parse_model_config(
        'name: "m"\ninstance_group [ { count: 2 kind: KIND_CPU rate_limiter { '
        'resources [ { name: "R1" count: 4 }, { name: "R2" count: 0 } ] priority: 3 } } ]',
        "config.pbtxt",
    )
    need = ResourceNeed.from_group(config.instance_group[0])
    assert need == ResourceNeed((("R1", 4),), 3)
