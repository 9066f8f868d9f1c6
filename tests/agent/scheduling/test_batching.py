"""The pure dynamic batcher: batch sizes, delays, queue bounds, timeouts, priorities, config."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import InvalidInputError, ModelConfigError, OverloadedError
from agent.repository.model_config import parse_model_config
from agent.scheduling.batching import (
    Batch,
    BatchFormer,
    BatchingPolicy,
    QueuePolicy,
    TimeoutAction,
)

US = 1e-6


def former(**policy: Any) -> BatchFormer[str]:
    return BatchFormer[str](BatchingPolicy(**policy))


def fill(f: BatchFormer[str], names: str, now: float = 0.0, rows: int = 1) -> None:
    for name in names:
        f.add(name, rows, now)


def items(batch: Batch[str] | None) -> str:
    assert batch is not None
    return "".join(batch.items)


def test_preferred_size_forms_at_once() -> None:
    f = former(max_batch_size=16, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000)
    fill(f, "abcdefgh")
    batch = f.take(0.0)
    assert batch is not None
    assert batch.items == tuple("abcdefgh")
    assert batch.rows == 8
    assert len(f) == 0


def test_below_preferred_waits_for_delay_then_takes_all() -> None:
    f = former(max_batch_size=16, preferred_batch_sizes=(8,), max_queue_delay_us=100)
    fill(f, "abcde")
    assert f.take(50 * US) is None
    assert f.deadline() == pytest.approx(100 * US)
    assert items(f.take(100 * US)) == "abcde"


def test_largest_reachable_preferred_size_runs_at_once() -> None:
    f = former(max_batch_size=16, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000)
    fill(f, "abcde")
    assert items(f.take(0.0)) == "abcd"
    assert f.take(0.0) is None  # "e" alone waits for the delay
    assert items(f.take(1000 * US)) == "e"


def test_rows_past_largest_preferred_run_without_waiting() -> None:
    # 3 + 6 rows jump past 8: no later arrival can make a FIFO prefix of 4 or 8 rows.
    f = former(max_batch_size=16, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000)
    f.add("a", 3, 0.0)
    f.add("b", 6, 0.0)
    batch = f.take(0.0)
    assert batch is not None
    assert (batch.items, batch.rows) == (("a",), 3)


def test_exact_preferred_size_wins_over_a_longer_prefix() -> None:
    f = former(max_batch_size=16, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000)
    fill(f, "abcd")
    f.add("e", 2, 0.0)
    f.add("f", 3, 0.0)  # 4 rows, then 6, then 9: past 8, so 4 (a preferred size) runs now
    assert items(f.take(0.0)) == "abcd"


def test_max_batch_size_caps_the_batch() -> None:
    f = former(max_batch_size=4, max_queue_delay_us=1_000_000)
    fill(f, "abcdef")
    assert items(f.take(0.0)) == "abcd"
    assert f.take(0.0) is None
    assert items(f.take(1.0)) == "ef"


def test_multi_row_requests_are_never_split() -> None:
    f = former(max_batch_size=8, max_queue_delay_us=100)
    fill(f, "abc", rows=3)
    batch = f.take(100 * US)
    assert batch is not None
    assert (batch.items, batch.rows, batch.sizes) == (("a", "b"), 6, (3, 3))
    assert f.pending_rows == 3


def test_batch_that_cannot_grow_runs_at_once() -> None:
    f = former(max_batch_size=8, max_queue_delay_us=1_000_000)
    f.add("a", 5, 0.0)
    assert f.take(0.0) is None
    f.add("b", 4, 0.0)
    batch = f.take(0.0)
    assert batch is not None
    assert (batch.items, batch.rows) == (("a",), 5)


def test_rows_out_of_range_are_invalid() -> None:
    f = former(max_batch_size=4)
    with pytest.raises(InvalidInputError, match="max_batch_size"):
        f.add("a", 5, 0.0)
    with pytest.raises(InvalidInputError):
        f.add("a", 0, 0.0)
    assert len(f) == 0


def test_delay_counts_from_the_oldest_request() -> None:
    f = former(max_batch_size=8, max_queue_delay_us=100)
    f.add("a", 1, 0.0)
    f.add("b", 1, 80 * US)
    assert f.take(99 * US) is None
    assert f.deadline() == pytest.approx(100 * US)
    assert items(f.take(100 * US)) == "ab"


def test_zero_delay_takes_whatever_is_queued() -> None:
    f = former(max_batch_size=8, preferred_batch_sizes=(4,))
    fill(f, "abc")
    assert items(f.take(0.0)) == "abc"
    assert f.take(0.0) is None


def test_full_queue_raises_overloaded_naming_the_limit() -> None:
    f = former(max_batch_size=1, default_queue_policy=QueuePolicy(max_queue_size=2))
    fill(f, "ab")
    with pytest.raises(OverloadedError, match="max_queue_size 2"):
        f.add("c", 1, 0.0)
    assert items(f.take(0.0)) == "a"
    f.add("c", 1, 0.0)
    assert len(f) == 2


def test_reject_timeout_is_returned_by_expire_and_never_batched() -> None:
    f = former(max_batch_size=8, default_queue_policy=QueuePolicy(default_timeout_us=1000))
    f.add("a", 1, 0.0)
    f.add("b", 1, 500 * US)
    assert f.deadline() == pytest.approx(0.0)  # zero delay: due at once
    assert f.expire(999 * US) == []
    assert f.expire(1000 * US) == ["a"]
    assert items(f.take(1000 * US)) == "b"


def test_take_sets_rejected_aside_for_expire() -> None:
    f = former(max_batch_size=8, default_queue_policy=QueuePolicy(default_timeout_us=1000))
    fill(f, "ab")
    f.add("c", 1, 1500 * US)
    assert items(f.take(1500 * US)) == "c"
    assert f.deadline() == pytest.approx(1000 * US)
    assert f.expire(1500 * US) == ["a", "b"]
    assert f.deadline() is None


def test_expired_reject_frees_its_queue_slot() -> None:
    queue = QueuePolicy(max_queue_size=1, default_timeout_us=1000)
    f = former(max_batch_size=8, max_queue_delay_us=10_000, default_queue_policy=queue)
    f.add("a", 1, 0.0)
    f.add("b", 1, 1000 * US)
    assert f.expire(1000 * US) == ["a"]
    assert len(f) == 1


def test_delay_timeout_moves_request_behind_unexpired_ones() -> None:
    queue = QueuePolicy(default_timeout_us=1000, timeout_action=TimeoutAction.DELAY)
    f = former(max_batch_size=1, default_queue_policy=queue)
    f.add("a", 1, 0.0)
    f.add("b", 1, 500 * US)
    f.add("c", 1, 600 * US)
    assert f.expire(1200 * US) == []
    assert [items(f.take(1200 * US)) for _ in range(3)] == ["b", "c", "a"]


def test_delayed_request_stays_ahead_of_lower_levels() -> None:
    delay = QueuePolicy(default_timeout_us=1000, timeout_action=TimeoutAction.DELAY)
    f = former(
        max_batch_size=1,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: delay},
    )
    f.add("a", 1, 0.0, priority=1)
    f.add("b", 1, 0.0, priority=1)
    f.add("c", 1, 900 * US, priority=1)
    f.add("z", 1, 900 * US)
    f.expire(1000 * US)
    assert [items(f.take(1000 * US)) for _ in range(4)] == ["c", "a", "b", "z"]


def test_timeout_override_honoured_when_allowed() -> None:
    queue = QueuePolicy(default_timeout_us=10_000, allow_timeout_override=True)
    f = former(max_batch_size=8, max_queue_delay_us=100_000, default_queue_policy=queue)
    f.add("a", 1, 0.0, timeout_us=1000)
    f.add("b", 1, 0.0, timeout_us=50_000)  # may shorten, never lengthen
    f.add("c", 1, 0.0, timeout_us=0)  # 0: the default
    assert f.deadline() == pytest.approx(1000 * US)
    assert f.expire(1000 * US) == ["a"]
    assert f.expire(10_000 * US) == ["b", "c"]


def test_timeout_override_ignored_when_not_allowed() -> None:
    queue = QueuePolicy(default_timeout_us=10_000)
    f = former(max_batch_size=8, max_queue_delay_us=100_000, default_queue_policy=queue)
    f.add("a", 1, 0.0, timeout_us=1000)
    assert f.expire(1000 * US) == []
    assert f.expire(10_000 * US) == ["a"]


def test_timeout_override_without_default_timeout() -> None:
    queue = QueuePolicy(allow_timeout_override=True)
    f = former(max_batch_size=8, max_queue_delay_us=100_000, default_queue_policy=queue)
    f.add("a", 1, 0.0, timeout_us=1000)
    f.add("b", 1, 0.0)
    assert f.expire(1000 * US) == ["a"]
    with pytest.raises(InvalidInputError):
        f.add("c", 1, 1000 * US, timeout_us=-1)


def test_timeouts_still_apply_once_timed_requests_left_in_batches() -> None:
    # Sweeps and deadline scans skip a level holding no request with a timeout: the count of
    # those must follow every way a request leaves the queue.
    queue = QueuePolicy(allow_timeout_override=True)
    f = former(max_batch_size=2, default_queue_policy=queue)
    f.add("a", 1, 0.0, timeout_us=100)
    f.add("b", 1, 0.0)
    f.add("c", 1, 0.0, timeout_us=50)
    assert f.expiry_deadline() == pytest.approx(50 * US)
    assert items(f.take(0.0)) == "ab"  # a (timed) leaves in a batch
    assert f.expiry_deadline() == pytest.approx(50 * US)
    assert f.expire(60 * US) == ["c"]
    assert f.expiry_deadline() is None
    f.add("d", 1, 70 * US)
    assert f.expire(1.0) == []
    assert items(f.take(1.0)) == "d"
    f.add("e", 1, 2.0, timeout_us=10)
    f.add("g", 1, 2.0)
    assert f.expire(2.0 + 20 * US) == ["e"]
    assert f.drain() == ["g"]
    f.add("h", 1, 3.0, timeout_us=10)
    assert f.expiry_deadline() == pytest.approx(3.0 + 10 * US)


def test_queue_longer_than_max_batch_forms_the_same_batches() -> None:
    # take() stops reading the queue at the first request past max_batch_size.
    f = former(max_batch_size=32, max_queue_delay_us=100)
    names = "".join(chr(ord("0") + i) for i in range(40))
    fill(f, names)
    assert items(f.take(0.0)) == names[:32]
    assert f.take(0.0) is None  # 8 left: below max_batch_size, waits for the delay
    assert f.deadline() == pytest.approx(100 * US)
    assert items(f.take(100 * US)) == names[32:]


def test_level_one_runs_first_and_default_level_applies() -> None:
    f = former(max_batch_size=1, priority_levels=3, default_priority_level=2)
    f.add("low", 1, 0.0, priority=3)
    f.add("default", 1, 0.0)
    f.add("zero", 1, 0.0, priority=0)
    f.add("high", 1, 0.0, priority=1)
    assert f.level_sizes == {1: 1, 2: 2, 3: 1}
    order = [items(f.take(0.0)) for _ in range(4)]
    assert order == ["high", "default", "zero", "low"]


def test_batch_spans_levels_in_priority_order() -> None:
    f = former(max_batch_size=8, priority_levels=2, default_priority_level=2)
    f.add("b", 1, 0.0)
    f.add("a", 1, 0.0, priority=1)
    assert items(f.take(0.0)) == "ab"


def test_invalid_priority_is_rejected() -> None:
    f = former(max_batch_size=4, priority_levels=2, default_priority_level=1)
    with pytest.raises(InvalidInputError, match=r"priority 3 is not in 1\.\.2"):
        f.add("a", 1, 0.0, priority=3)
    with pytest.raises(InvalidInputError):
        f.add("a", 1, 0.0, priority=-1)
    assert len(f) == 0


def test_priority_ignored_without_levels() -> None:
    f = former(max_batch_size=4)
    f.add("a", 1, 0.0, priority=7)
    assert f.level_sizes == {1: 1}


def test_level_queue_policies_apply_per_level() -> None:
    f = former(
        max_batch_size=8,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: QueuePolicy(max_queue_size=1)},
    )
    f.add("a", 1, 0.0, priority=1)
    with pytest.raises(OverloadedError, match="priority level 1"):
        f.add("b", 1, 0.0, priority=1)
    fill(f, "cde")  # level 2 is unbounded
    assert len(f) == 4


def test_fifo_within_a_level() -> None:
    f = former(max_batch_size=8, max_queue_delay_us=100)
    for i, name in enumerate("dcba"):
        f.add(name, 1, i * US)
    assert items(f.take(200 * US)) == "dcba"


def test_deadline_values() -> None:
    queue = QueuePolicy(default_timeout_us=50)
    f = former(max_batch_size=8, max_queue_delay_us=100, default_queue_policy=queue)
    assert f.deadline() is None
    f.add("a", 1, 1.0)
    assert f.deadline() == pytest.approx(1.0 + 50 * US)  # timeout before the delay end
    assert f.expire(1.0 + 50 * US) == ["a"]
    assert f.deadline() is None
    f = former(max_batch_size=8, max_queue_delay_us=100)
    f.add("a", 1, 2.0)
    f.add("b", 1, 2.5)
    assert f.deadline() == pytest.approx(2.0 + 100 * US)


def test_deadline_is_exact_for_take() -> None:
    # The instant deadline() reports must make take() fire (no float-rounding spin).
    f = former(max_batch_size=8, max_queue_delay_us=100)
    f.add("a", 1, 1.1)
    due = f.deadline()
    assert due is not None
    assert items(f.take(due)) == "a"


def test_max_rows_caps_the_batch() -> None:
    f = former(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=1_000_000)
    fill(f, "abc")
    assert f.take(0.0) is None
    assert items(f.take(0.0, max_rows=3)) == "abc"  # 4 is out of reach: 3 is the cap
    fill(f, "def")
    assert items(f.take(1.0, max_rows=2)) == "de"
    f.add("g", 3, 1.0)
    f.take(1.0)
    assert f.take(2.0, max_rows=2) is None  # "g" needs 3 rows
    with pytest.raises(ValueError, match="max_rows"):
        f.take(2.0, max_rows=0)


def test_unbatched_runs_each_request_alone() -> None:
    f = BatchFormer[str](BatchingPolicy.unbatched(4))
    f.add("a", 1, 0.0)
    f.add("b", 1, 0.0)
    f.add("c", 3, 0.0)
    assert f.deadline() == 0.0
    assert items(f.take(0.0)) == "a"
    assert items(f.take(0.0)) == "b"
    assert f.take(0.0, max_rows=2) is None  # "c" needs 3 rows
    assert items(f.take(0.0)) == "c"
    assert f.take(0.0) is None


def test_drain_returns_everything_in_queue_order() -> None:
    queue = QueuePolicy(default_timeout_us=1000)
    f = former(
        max_batch_size=8,
        max_queue_delay_us=100_000,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=queue,
    )
    f.add("a", 1, 0.0)
    f.add("c", 1, 2000 * US)
    f.add("b", 1, 2000 * US, priority=1)
    assert f.take(2000 * US) is None  # "a" expired: set aside for expire()
    assert f.drain() == ["a", "b", "c"]
    assert (len(f), f.deadline(), f.expire(1.0)) == (0, None, [])


def test_policy_normalizes_and_validates() -> None:
    policy = BatchingPolicy(max_batch_size=8, preferred_batch_sizes=(8, 2, 4, 2))
    assert policy.preferred_batch_sizes == (2, 4, 8)
    with pytest.raises(ValueError, match="preferred"):
        BatchingPolicy(max_batch_size=4, preferred_batch_sizes=(8,))
    with pytest.raises(ValueError, match="default_priority_level"):
        BatchingPolicy(max_batch_size=4, priority_levels=2)
    with pytest.raises(ValueError, match="max_queue_size"):
        QueuePolicy(max_queue_size=-1)


CONFIG = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "data_0", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
output [ { name: "fc6_1", data_type: TYPE_FP32, dims: [ 1000 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8, 4 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000000000
    max_queue_size: 16
  }
  priority_queue_policy {
    key: 1
    value: { max_queue_size: 4, allow_timeout_override: true }
  }
}
"""


def test_from_config_reads_dynamic_batching() -> None:
    policy = BatchingPolicy.from_config(parse_model_config(CONFIG, "config.pbtxt"))
    assert policy.max_batch_size == 8
    assert policy.preferred_batch_sizes == (4, 8)
    assert policy.max_queue_delay_us == 100
    assert policy.preserve_ordering
    assert (policy.priority_levels, policy.default_priority_level) == (2, 1)
    assert policy.dynamic_batching
    assert policy.default_queue_policy == QueuePolicy(
        max_queue_size=16,
        default_timeout_us=5_000_000_000,
        timeout_action=TimeoutAction.DELAY,
    )
    assert policy.queue_policy(1) == QueuePolicy(max_queue_size=4, allow_timeout_override=True)
    assert policy.queue_policy(2) == policy.default_queue_policy


def test_from_config_cap_drops_larger_preferred_sizes() -> None:
    config = parse_model_config(CONFIG, "config.pbtxt")
    policy = BatchingPolicy.from_config(config, max_batch_size=6)
    assert (policy.max_batch_size, policy.preferred_batch_sizes) == (6, (4,))
    assert BatchingPolicy.from_config(config, max_batch_size=64).max_batch_size == 8


def test_from_config_without_dynamic_batching_is_unbatched() -> None:
    text = CONFIG.split("dynamic_batching", maxsplit=1)[0]
    policy = BatchingPolicy.from_config(parse_model_config(text, "config.pbtxt"))
    assert policy == BatchingPolicy.unbatched(8)
    assert not policy.dynamic_batching
    no_batch_dim = text.replace("max_batch_size: 8", "max_batch_size: 0")
    policy = BatchingPolicy.from_config(parse_model_config(no_batch_dim, "config.pbtxt"))
    assert policy.max_batch_size == 1


def test_from_config_batcher_on_model_without_batch_dimension_only_queues() -> None:
    text = """max_batch_size: 0
    dynamic_batching {
      max_queue_delay_microseconds: 100
      default_queue_policy { max_queue_size: 3 }
    }"""
    policy = BatchingPolicy.from_config(parse_model_config(text, "config.pbtxt"))
    assert (policy.max_batch_size, policy.dynamic_batching) == (1, False)
    assert policy.default_queue_policy.max_queue_size == 3
    f = BatchFormer[str](policy)
    fill(f, "ab", now=1.0)
    assert f.deadline() == 1.0  # no waiting for the delay: nothing would join
    assert items(f.take(1.0)) == "a"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("preferred_batch_size: [ 16 ]", "preferred_batch_size"),
        ("priority_levels: 2\ndefault_priority_level: 3", "default_priority_level"),
        (
            "priority_levels: 2\ndefault_priority_level: 1\n"
            "priority_queue_policy { key: 3 value: { max_queue_size: 1 } }",
            "priority_queue_policy",
        ),
    ],
)
def test_from_config_rejects_out_of_range_values(section: str, message: str) -> None:
    text = f"max_batch_size: 8\ndynamic_batching {{\n{section}\n}}"
    with pytest.raises(ModelConfigError, match=message):
        BatchingPolicy.from_config(parse_model_config(text, "config.pbtxt"))
