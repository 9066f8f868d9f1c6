"""The sequence batcher's pure core: slots, order, strategies, idling and the backlog."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from agent.errors import InvalidInputError, OverloadedError
from agent.proto import model_config_pb2 as mc
from agent.scheduling.sequence_policy import (
    SequenceBatcher,
    SequencePolicy,
    SequenceRequest,
    Step,
    sequence_parameters,
)
from agent.scheduling.sequence_tensors import SequenceTensors

IDLE_US = 1000


def direct(
    slots: int = 2, batch: int = 2, delay_us: int = 0, utilization: float = 0.0
) -> SequenceBatcher[str]:
    policy = SequencePolicy(
        strategy="direct",
        max_batch_size=batch,
        slots=slots,
        max_sequence_idle_us=IDLE_US,
        max_queue_delay_us=delay_us,
        minimum_slot_utilization=utilization,
    )
    return SequenceBatcher(policy, "m")


def test_parameters_as_tritonclient_sends_them() -> None:
    assert sequence_parameters({}) is None
    assert sequence_parameters({"sequence_id": 0}) is None
    assert sequence_parameters({"sequence_id": 7, "sequence_start": True}) == SequenceRequest(
        7, True, False
    )
    assert sequence_parameters({"sequence_id": "abc", "sequence_end": True}) == SequenceRequest(
        "abc", False, True
    )
    with pytest.raises(InvalidInputError, match="sequence_id"):
        sequence_parameters({"sequence_id": 1.5})
    with pytest.raises(InvalidInputError, match="sequence_start"):
        sequence_parameters({"sequence_id": 1, "sequence_start": "yes"})


def test_missing_start_and_missing_id_use_tritons_words() -> None:
    b = direct()
    with pytest.raises(InvalidInputError, match="must specify the START flag on the first"):
        b.add(5, "x", start=False, end=False, now=0.0)
    with pytest.raises(InvalidInputError, match="non-zero or non-empty correlation ID"):
        b.add(0, "x", start=True, end=False, now=0.0)


def test_one_request_per_sequence_in_order() -> None:
    b = direct(slots=2, batch=2)
    b.add(1, "1a", start=True, end=False, now=0.0)
    b.add(1, "1b", start=False, end=True, now=0.0)
    b.add(2, "2a", start=True, end=True, now=0.0)
    first = b.take(0.0)
    assert first is not None
    assert [s.item for s in first] == ["1a", "2a"]
    assert [s.start for s in first] == [True, True]
    assert b.take(0.0) is None  # 1b waits for 1a: one request per sequence in flight
    assert b.done(first, 0.0) == [2]
    second = b.take(0.0)
    assert second is not None
    assert [(s.item, s.end) for s in second] == [("1b", True)]
    assert b.done(second, 0.0) == [1]
    assert b.live == 0


def test_backlog_waits_for_a_slot_then_runs() -> None:
    b = direct(slots=1, batch=1)
    b.add(1, "1a", start=True, end=True, now=0.0)
    b.add(2, "2a", start=True, end=False, now=0.0)
    b.add(2, "2b", start=False, end=True, now=0.0)
    assert b.waiting == 1
    assert b.owns(2)
    steps = b.take(0.0)
    assert steps is not None
    assert [s.item for s in steps] == ["1a"]
    assert b.take(0.0) is None
    b.done(steps, 0.0)
    assert b.waiting == 0
    steps = b.take(0.0)
    assert steps is not None
    assert [s.item for s in steps] == ["2a"]


def test_backlog_refused_when_no_slot_frees_in_time() -> None:
    b = direct(slots=1, batch=1)
    b.add(1, "1a", start=True, end=False, now=0.0)
    b.add(2, "2a", start=True, end=False, now=0.0, timeout_us=100)
    assert b.deadline() is not None
    assert b.expire(0.00005).refused == ()
    gone = b.expire(0.0002)
    assert gone.refused == ("2a",)
    assert not b.owns(2)


def test_backlog_bound_is_a_503() -> None:
    policy = SequencePolicy(strategy="direct", max_batch_size=1, slots=1, max_backlog=1)
    b: SequenceBatcher[str] = SequenceBatcher(policy, "m")
    b.add(1, "a", start=True, end=False, now=0.0)
    b.add(2, "b", start=True, end=False, now=0.0)
    with pytest.raises(OverloadedError, match="sequence slots are taken"):
        b.add(3, "c", start=True, end=False, now=0.0)


def test_idle_sequence_is_released_and_a_late_request_is_told_why() -> None:
    b = direct(slots=1, batch=1)
    b.add(1, "1a", start=True, end=False, now=0.0)
    b.add(2, "2a", start=True, end=False, now=0.0)  # backlog
    steps = b.take(0.0)
    assert steps is not None
    b.done(steps, 0.0)
    assert b.deadline() == pytest.approx(IDLE_US * 1e-6)
    assert b.expire(0.0005).released == ()
    gone = b.expire(0.001)
    assert gone.released == (1,)
    assert b.live == 1
    assert b.waiting == 0
    with pytest.raises(InvalidInputError, match="released after 1000 us idle"):
        b.add(1, "1b", start=False, end=False, now=0.002)
    b.add(1, "1c", start=True, end=False, now=0.002)  # a new START is welcome


def test_direct_waits_for_slot_utilization_or_the_delay() -> None:
    b = direct(slots=4, batch=4, delay_us=100, utilization=0.5)
    b.add(1, "a", start=True, end=False, now=0.0)
    assert b.take(0.0) is None
    assert b.deadline() == pytest.approx(0.0001)
    b.add(2, "b", start=True, end=False, now=0.00001)
    steps = b.take(0.00001)
    assert steps is not None
    assert len(steps) == 2
    b.add(3, "c", start=True, end=False, now=0.001)
    assert b.take(0.001) is None
    steps = b.take(0.0011)
    assert steps is not None
    assert [s.item for s in steps] == ["c"]


def test_oldest_batches_on_preferred_size_or_after_the_delay() -> None:
    policy = SequencePolicy(
        strategy="oldest",
        max_batch_size=4,
        slots=8,
        max_queue_delay_us=100,
        preferred_batch_sizes=(2,),
    )
    b: SequenceBatcher[int] = SequenceBatcher(policy, "m")
    b.add(1, 1, start=True, end=False, now=0.0)
    assert b.take(0.0) is None
    b.add(2, 2, start=True, end=False, now=0.0)
    b.add(3, 3, start=True, end=False, now=0.0)
    steps = b.take(0.0)
    assert steps is not None
    assert [s.item for s in steps] == [1, 2]
    assert b.take(0.00005) is None
    steps = b.take(0.0001)
    assert steps is not None
    assert [s.item for s in steps] == [3]


def test_start_for_a_live_id_continues_in_its_slot() -> None:
    b = direct(slots=1, batch=1)
    b.add(1, "a", start=True, end=True, now=0.0)
    b.add(1, "b", start=True, end=False, now=0.0)
    steps = b.take(0.0)
    assert steps is not None
    assert b.done(steps, 0.0) == []  # the next sequence of id 1 keeps the slot
    steps = b.take(0.0)
    assert steps is not None
    assert steps[0].start


CONFIG = """
name: "acc"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
    { name: "END" control [{ kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1] }] },
    { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] }] },
    { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }
  ]
  state [{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [2]
           initial_state: { data_type: TYPE_FP32 dims: [2] zero_data: true name: "z" } }]
}
"""


def test_control_tensors_in_each_configured_form() -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    tensors = SequenceTensors.from_config(config)
    feeds = tensors.control_feeds([(7, True, False), (9, False, True)])
    assert feeds["START"].dtype == np.int32
    assert feeds["START"].ravel().tolist() == [1, 0]
    assert feeds["END"].dtype == np.float32
    assert feeds["END"].ravel().tolist() == [0.0, 1.0]
    assert feeds["READY"].dtype == np.bool_
    assert feeds["READY"].ravel().tolist() == [True, True]
    assert feeds["CORRID"].dtype == np.uint64
    assert feeds["CORRID"].ravel().tolist() == [7, 9]
    assert feeds["START"].shape == (2, 1)
    state = tensors.state_feeds([None, {"S_OUT": np.ones(2, np.float32)}])
    assert state["S_IN"].tolist() == [[0, 0], [1, 1]]
    assert tensors.state_bytes == 8
    with pytest.raises(InvalidInputError, match="data-type is 'BYTES', but model 'acc'"):
        tensors.check_corrid("abc")
    tensors.check_corrid(5)


def test_policy_from_config_per_strategy() -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.sequence_batching.direct.max_queue_delay_microseconds = 50
    policy = SequencePolicy.from_config(config, instances=2)
    assert (policy.strategy, policy.slots, policy.max_queue_delay_us) == ("direct", 8, 50)
    assert policy.max_sequence_idle_us == 1_000_000
    config.sequence_batching.oldest.max_candidate_sequences = 16
    config.sequence_batching.oldest.preferred_batch_size.append(2)
    policy = SequencePolicy.from_config(config, instances=1)
    assert (policy.strategy, policy.slots, policy.preferred_batch_sizes) == ("oldest", 16, (2,))


def test_a_model_without_batch_dimension_gets_unbatched_controls_and_state() -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.max_batch_size = 0
    tensors = SequenceTensors.from_config(config)
    feeds = tensors.control_feeds([(7, True, False)])
    assert feeds["START"].shape == (1,)
    assert tensors.state_feeds([None])["S_IN"].shape == (2,)
    policy = SequencePolicy.from_config(config, instances=3)
    assert (policy.max_batch_size, policy.slots) == (1, 3)


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
def test_random_traffic_keeps_order_slots_and_one_request_per_sequence(strategy: str) -> None:
    rng = np.random.default_rng(3)
    policy = SequencePolicy(
        strategy=strategy,  # type: ignore[arg-type]
        max_batch_size=3,
        slots=4,
        max_sequence_idle_us=10**9,
        max_queue_delay_us=50,
        preferred_batch_sizes=(2,),
    )
    b: SequenceBatcher[tuple[int, int]] = SequenceBatcher(policy, "m")
    lengths = {corrid: int(rng.integers(1, 6)) for corrid in range(1, 31)}
    sent = dict.fromkeys(lengths, 0)
    ran: dict[int, list[int]] = {c: [] for c in lengths}
    running: list[list[Step[tuple[int, int]]]] = []
    now = 0.0
    for _ in range(100_000):  # bounded: a stall fails below instead of hanging
        if not (any(sent[c] < n for c, n in lengths.items()) or running or len(b)):
            break
        now += float(rng.uniform(0, 40e-6))
        open_ = [c for c, n in lengths.items() if sent[c] < n]
        if open_ and rng.random() < 0.6:
            c = open_[int(rng.integers(len(open_)))]
            i = sent[c]
            b.add(c, (c, i), start=i == 0, end=i == lengths[c] - 1, now=now)
            sent[c] += 1
        if running and rng.random() < 0.5:
            b.done(running.pop(0), now)
        b.expire(now)
        steps = b.take(now) if len(running) < 2 else None
        if steps is not None:
            assert len(steps) <= 3
            corrids = [s.correlation_id for s in steps]
            assert len(set(corrids)) == len(corrids)  # one request per sequence
            for s in steps:
                ran[s.item[0]].append(s.item[1])
                assert s.start == (s.item[1] == 0)
            running.append(steps)
        assert b.live <= 4
    for c, n in lengths.items():
        assert ran[c] == list(range(n)), c
    assert b.live == 0
