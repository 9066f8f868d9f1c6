"""Memory budget detection, footprint measurement, capacity planning and the ledger."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.errors import ModelLoadError
from agent.models.memory_plan import (
    MIB,
    CapacityPlan,
    Footprint,
    MemoryLedger,
    detect_budget_bytes,
    measure_footprint,
    plan_capacity,
    process_rss_bytes,
)
from agent.runtime.demo import IR_VERSION, OPSET

GIB = 1 << 30
RAM = 8 * GIB


def detect(
    tmp_path: Path,
    membership: str,
    files: dict[str, str],
    configured: int | None = None,
    share: float = 0.8,
) -> tuple[int, str]:
    """detect_budget_bytes over a fake cgroup mount and /proc/self/cgroup under tmp_path."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(membership)
    return detect_budget_bytes(
        configured, cgroup_root=root, proc_self_cgroup=proc, total_ram=RAM, share=share
    )


def test_cgroup_v2_limit_is_the_budget(tmp_path: Path) -> None:
    budget = detect(
        tmp_path,
        "0::/system.slice/agent.service\n",
        {"system.slice/agent.service/memory.max": "536870912\n"},
    )
    assert budget == (512 * MIB, "cgroup memory.max")


def test_cgroup_v2_max_falls_through_to_the_ram_share(tmp_path: Path) -> None:
    budget = detect(tmp_path, "0::/agent\n", {"agent/memory.max": "max\n"})
    assert budget == (int(RAM * 0.8), "80% of RAM")


def test_lowest_limit_on_the_cgroup_path_wins(tmp_path: Path) -> None:
    budget = detect(
        tmp_path,
        "0::/parent/child\n",
        {"parent/memory.max": str(256 * MIB), "parent/child/memory.max": "max"},
    )
    assert budget == (256 * MIB, "cgroup memory.max")


def test_container_namespace_reads_the_root_file(tmp_path: Path) -> None:
    assert detect(tmp_path, "0::/\n", {"memory.max": str(GIB)}) == (GIB, "cgroup memory.max")


def test_cgroup_v1_limit_is_the_budget(tmp_path: Path) -> None:
    membership = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
    budget = detect(tmp_path, membership, {"memory/docker/abc/memory.limit_in_bytes": "314572800"})
    assert budget == (300 * MIB, "cgroup memory.limit_in_bytes")


def test_cgroup_v1_huge_value_means_unlimited(tmp_path: Path) -> None:
    budget = detect(
        tmp_path, "11:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712"}
    )
    assert budget == (int(RAM * 0.8), "80% of RAM")


def test_limit_not_below_ram_is_ignored(tmp_path: Path) -> None:
    budget = detect(tmp_path, "0::/\n", {"memory.max": str(64 * GIB)}, share=0.5)
    assert budget == (RAM // 2, "50% of RAM")


def test_unreadable_or_garbage_cgroup_files_fall_through(tmp_path: Path) -> None:
    assert detect(tmp_path, "0::/\n", {"memory.max": "lots"}) == (int(RAM * 0.8), "80% of RAM")
    missing = tmp_path / "none"
    budget = detect_budget_bytes(
        None, cgroup_root=missing, proc_self_cgroup=missing / "cgroup", total_ram=RAM
    )
    assert budget == (int(RAM * 0.8), "80% of RAM")


def test_configured_budget_wins_over_cgroup(tmp_path: Path) -> None:
    budget = detect(tmp_path, "0::/\n", {"memory.max": str(GIB)}, configured=100 * MIB)
    assert budget == (100 * MIB, "config")


@pytest.mark.parametrize(("configured", "share"), [(0, 0.8), (-5, 0.8), (None, 0.0), (None, 1.5)])
def test_bad_configured_budget_or_share_is_refused(configured: int | None, share: float) -> None:
    with pytest.raises(ValueError, match=r"budget|share"):
        detect_budget_bytes(configured, total_ram=RAM, share=share)


def test_process_rss_is_plausible() -> None:
    assert 10 * MIB < process_rss_bytes() < RAM * 4


def test_footprint_is_linear_between_its_two_points() -> None:
    fp = Footprint(100, 800, 8)
    assert fp.per_row_bytes == 100.0
    assert [fp.bytes_for(b) for b in (1, 4, 8, 16)] == [100, 400, 800, 1600]
    assert Footprint(10, 20, 4).bytes_for(2) == 14  # 10 + 10/3 rounded up
    assert Footprint(50, 50, 1).bytes_for(32) == 50
    assert Footprint(50, 50, 1).per_row_bytes == 0.0


@pytest.mark.parametrize(("at_1", "at_max", "max_batch"), [(-1, 0, 2), (10, 5, 2), (1, 2, 0)])
def test_inconsistent_footprint_is_refused(at_1: int, at_max: int, max_batch: int) -> None:
    with pytest.raises(ValueError, match=r"max_batch|bytes_at"):
        Footprint(at_1, at_max, max_batch)


def test_footprint_rejects_batch_below_one() -> None:
    with pytest.raises(ValueError, match="batch"):
        Footprint(1, 2, 2).bytes_for(0)


def fake_rss(readings: list[int]) -> Iterator[int]:
    yield from readings


def test_measure_footprint_takes_growth_and_the_highest_batch_1_reading() -> None:
    readings = fake_rss([1000, 1500, 1700, 1600, 4000])
    runs: list[tuple[str, int]] = []
    model, fp = measure_footprint(
        lambda: "model", lambda m, b: runs.append((m, b)), 8, lambda: next(readings)
    )
    assert model == "model"
    assert runs == [("model", 1)] * 3 + [("model", 8)]
    assert fp == Footprint(700, 3000, 8)
    assert next(readings, None) is None


def test_measure_footprint_never_goes_negative() -> None:
    readings = fake_rss([1000, 900, 900, 950, 800])
    _, fp = measure_footprint(lambda: None, lambda m, b: None, 4, lambda: next(readings))
    assert fp == Footprint(0, 0, 4)


def test_measure_footprint_at_max_batch_1_runs_batch_1_only() -> None:
    readings = fake_rss([0, 10])
    runs: list[int] = []
    _, fp = measure_footprint(
        lambda: 1, lambda m, b: runs.append(b), 1, lambda: next(readings), repeats=1
    )
    assert (runs, fp) == ([1], Footprint(10, 10, 1))


FP = Footprint(100 * MIB, 162 * MIB, 32)  # 2 MiB per extra row


def test_plan_keeps_the_config_when_it_fits() -> None:
    plan = plan_capacity(FP, budget_left=400 * MIB, max_batch_size=32, instances=2)
    assert plan == CapacityPlan(
        32, 2, 324 * MIB, "fits as configured in 400 MiB left (estimate 324 MiB)"
    )


def test_plan_lowers_instances_before_the_batch_cap() -> None:
    plan = plan_capacity(FP, budget_left=330 * MIB, max_batch_size=32, instances=4)
    assert (plan.max_batch_size, plan.instances, plan.estimated_bytes) == (32, 2, 324 * MIB)
    assert plan.reason == "instances lowered from 4 to 2 to fit 330 MiB left (estimate 324 MiB)"


def test_plan_lowers_the_batch_cap_when_one_instance_does_not_fit() -> None:
    plan = plan_capacity(FP, budget_left=121 * MIB, max_batch_size=32, instances=1)
    assert plan == CapacityPlan(
        11, 1, 120 * MIB, "batch cap lowered from 32 to 11 to fit 121 MiB left (estimate 120 MiB)"
    )
    both = plan_capacity(FP, budget_left=121 * MIB, max_batch_size=32, instances=3)
    assert (both.max_batch_size, both.instances) == (11, 1)
    assert both.reason.startswith("batch cap lowered from 32 to 11 and instances lowered from 3")


def test_plan_counts_a_lone_run_session_as_one_run_more() -> None:
    # ONNX Runtime's session for runs that start alone holds one more run's arena.
    plan = plan_capacity(FP, budget_left=500 * MIB, max_batch_size=32, instances=2, extra_runs=1)
    assert (plan.max_batch_size, plan.instances, plan.estimated_bytes) == (32, 2, 486 * MIB)
    # Instances are lowered first; the extra run stays in the estimate.
    fewer = plan_capacity(FP, budget_left=400 * MIB, max_batch_size=32, instances=2, extra_runs=1)
    assert (fewer.max_batch_size, fewer.instances, fewer.estimated_bytes) == (32, 1, 324 * MIB)
    # Then the batch cap: two runs of the smaller batch must fit.
    tight = plan_capacity(FP, budget_left=242 * MIB, max_batch_size=32, instances=1, extra_runs=1)
    assert (tight.max_batch_size, tight.instances, tight.estimated_bytes) == (11, 1, 240 * MIB)
    with pytest.raises(ModelLoadError, match="needs 200 MiB at batch 1"):
        plan_capacity(FP, budget_left=199 * MIB, max_batch_size=32, instances=1, extra_runs=1)


def test_plan_never_exceeds_the_budget_left() -> None:
    for left in range(100, 700, 7):
        plan = plan_capacity(FP, budget_left=left * MIB, max_batch_size=32, instances=3)
        assert plan.estimated_bytes <= left * MIB
        assert plan.estimated_bytes == plan.instances * FP.bytes_for(plan.max_batch_size)


def test_plan_keeps_a_non_batching_model_unbatched() -> None:
    plan = plan_capacity(FP, budget_left=250 * MIB, max_batch_size=0, instances=4)
    assert (plan.max_batch_size, plan.instances, plan.estimated_bytes) == (0, 2, 200 * MIB)


def test_plan_refuses_a_model_that_does_not_fit_at_batch_1() -> None:
    fp = Footprint(120 * MIB, 200 * MIB, 8)
    with pytest.raises(ModelLoadError) as info:
        plan_capacity(
            fp, budget_left=80 * MIB, max_batch_size=8, instances=1, budget_bytes=512 * MIB
        )
    assert info.value.message == "needs 120 MiB at batch 1, 80 MiB left of the 512 MiB budget"


def test_plan_rejects_nonsense_limits() -> None:
    with pytest.raises(ValueError, match="instances"):
        plan_capacity(FP, budget_left=GIB, max_batch_size=8, instances=0)


def test_ledger_reserves_and_releases() -> None:
    ledger = MemoryLedger(1000)
    ledger.reserve(("a", "1"), 300)
    ledger.reserve(("b", "1"), 500)
    assert (ledger.budget_bytes(), ledger.used_bytes(), ledger.left()) == (1000, 800, 200)
    ledger.reserve(("a", "1"), 400)  # replaces a's 300
    assert ledger.left() == 100
    assert ledger.reserved() == {("a", "1"): 400, ("b", "1"): 500}
    assert ledger.release(("b", "1")) == 500
    assert ledger.release(("b", "1")) == 0
    assert (ledger.used_bytes(), ledger.left()) == (400, 600)


def test_ledger_refuses_what_does_not_fit_and_keeps_its_state() -> None:
    ledger = MemoryLedger(512 * MIB)
    ledger.reserve(("a", "1"), 432 * MIB)
    with pytest.raises(ModelLoadError, match="'b' version 2 needs 120 MiB, 80 MiB left"):
        ledger.reserve(("b", "2"), 120 * MIB)
    assert ledger.reserved() == {("a", "1"): 432 * MIB}


def test_ledger_never_overcommits_under_concurrent_reservations() -> None:
    ledger = MemoryLedger(500)

    def try_reserve(i: int) -> bool:
        try:
            ledger.reserve(("m", str(i)), 1)
        except ModelLoadError:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        granted = sum(pool.map(try_reserve, range(2000)))
    assert granted == 500
    assert (ledger.used_bytes(), ledger.left()) == (500, 0)


def mlp(sizes: list[int]) -> onnx.ModelProto:
    """FP32 MLP with random weights, dynamic batch: sizes[0] → ... → sizes[-1]."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "X"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * 0.01
        inits += [
            numpy_helper.from_array(w, f"W{i}"),
            numpy_helper.from_array(np.zeros(fan_out, np.float32), f"B{i}"),
        ]
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [f"H{i}"]))
        prev = f"H{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", sizes[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def test_measures_a_real_onnxruntime_session(tmp_path: Path) -> None:
    sizes = [256, 4096, 4096, 10]
    weight_bytes = 4 * sum(a * b + b for a, b in itertools.pairwise(sizes))  # ~71 MB
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(sizes), str(path))

    loaded: list[ort.InferenceSession] = []

    def load() -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        loaded.append(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
        return loaded[-1]

    def run(session: ort.InferenceSession, batch: int) -> None:
        session.run(None, {"X": np.ones((batch, sizes[0]), np.float32)})

    session, fp = measure_footprint(load, run, max_batch=8)
    assert len(loaded) == 1
    assert session is loaded[0]  # the instance it measured, loaded once
    assert fp.bytes_at_batch_1 >= weight_bytes // 2
    assert fp.bytes_at_max_batch >= fp.bytes_at_batch_1
