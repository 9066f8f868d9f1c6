"""The memory budget's pool for requests in flight (`agent.models.inflight`), pure."""

from __future__ import annotations

import pytest

from agent.errors import MemoryPressureError, OverloadedError
from agent.models.inflight import InflightBytes, body_cost, default_capacity
from agent.models.memory_plan import INFLIGHT_KEY, MemoryLedger

MIB = 1 << 20


def test_holds_add_up_to_the_capacity_and_no_further() -> None:
    pool = InflightBytes(10 * MIB)
    first = pool.hold(6 * MIB, "a JSON body of 2.0 MiB")
    second = pool.hold(4 * MIB, "another")
    assert pool.held_bytes == 10 * MIB
    with pytest.raises(MemoryPressureError) as refused:
        pool.hold(1, "one byte more")
    assert "0.0 MiB of the 10.0 MiB in-flight memory is free now" in refused.value.message
    assert isinstance(refused.value, OverloadedError)  # 503 on HTTP, retried by clients
    first.release()
    pool.hold(6 * MIB, "again").release()
    second.release()
    figures = pool.figures()
    assert (figures.held_bytes, figures.peak_bytes, figures.holds, figures.refused) == (
        0,
        10 * MIB,
        0,
        1,
    )


def test_a_request_larger_than_the_whole_pool_says_so() -> None:
    pool = InflightBytes(2 * MIB)
    with pytest.raises(MemoryPressureError, match=r"a JSON body of 1\.0 MiB needs 3\.0 MiB"):
        pool.hold(body_cost(MIB, binary=False), "a JSON body of 1.0 MiB")
    with pytest.raises(MemoryPressureError, match=r"more than the whole in-flight memory of 2\.0"):
        pool.hold(3 * MIB, "x")


def test_a_release_counts_once_and_a_grown_hold_releases_all_it_holds() -> None:
    pool = InflightBytes(4 * MIB)
    hold = pool.hold(MIB, "a request")
    hold.grow(5 * MIB)  # its response, already made: counted past the capacity
    assert pool.held_bytes == 6 * MIB
    with pytest.raises(MemoryPressureError):
        pool.hold(1, "the next one waits for it")
    hold.release()
    hold.release()
    hold.grow(MIB)  # after its release: nothing
    assert pool.held_bytes == 0
    assert pool.figures().peak_bytes == 6 * MIB


def test_nothing_to_hold_is_never_refused() -> None:
    pool = InflightBytes(0)
    with pool.hold(0, "an empty body"):
        assert pool.held_bytes == 0
    assert pool.figures().refused == 0


def test_json_costs_three_times_its_body_binary_twice() -> None:
    assert body_cost(1000, binary=False) == 3000
    assert body_cost(1000, binary=True) == 2000


@pytest.mark.parametrize(
    ("budget", "left", "expected"),
    [
        (8 << 30, 7 << 30, 1 << 30),  # a quarter, at most 1 GiB
        (1 << 30, 900 * MIB, 256 * MIB),
        (128 * MIB, 100 * MIB, 64 * MIB),  # at least 64 MiB...
        (128 * MIB, 40 * MIB, 40 * MIB),  # ...of what is left
        (1, 0, 0),
    ],
)
def test_the_default_pool(budget: int, left: int, expected: int) -> None:
    assert default_capacity(budget, left) == expected


def test_the_ledger_keeps_the_pool_before_any_model() -> None:
    ledger = MemoryLedger(1 << 30)
    ledger.reserve(("edge-agent", "base"), 100 * MIB)
    pool = ledger.keep_for_inflight(0)
    assert ledger.inflight is pool
    assert pool.capacity_bytes == 256 * MIB
    assert ledger.reserved()[INFLIGHT_KEY] == 256 * MIB
    assert ledger.left() == (1 << 30) - 356 * MIB
    ledger.reserve(("m", "1"), 5 * MIB)
    assert ledger.models_bytes() == 5 * MIB
    assert ledger.used_bytes() == 361 * MIB
    configured = MemoryLedger(1 << 30).keep_for_inflight(10 * MIB)
    assert configured.capacity_bytes == 10 * MIB
