"""bench.triton_compare: the agent against the real Triton, in rounds with the servers' order
rotated; medians and median per-round ratios."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.models import MODELS
from bench.triton_compare import (
    AGENT,
    AGENT_PYTHON,
    PINNED,
    TRITON,
    Measure,
    python_config,
    reference_pairs,
    render,
    run_compare,
    server_order,
    stub_onnxruntime,
    summarize,
    write_onnx_repository,
)
from tests.support import perf_analyzer


def test_the_servers_order_rotates_and_reverses() -> None:
    servers = [AGENT, AGENT_PYTHON, TRITON]
    orders = [server_order(i, servers) for i in range(4)]
    assert orders == [
        [AGENT, AGENT_PYTHON, TRITON],
        [TRITON, AGENT_PYTHON, AGENT],
        [AGENT_PYTHON, TRITON, AGENT],
        [AGENT, TRITON, AGENT_PYTHON],
    ]


def test_medians_and_the_median_of_the_per_round_ratios() -> None:
    rounds = [
        {AGENT: Measure(100.0, 1000.0), TRITON: Measure(50.0, 2000.0)},  # 2.0 / 0.5
        {AGENT: Measure(90.0, 1000.0), TRITON: Measure(100.0, 1000.0)},  # 0.9 / 1.0
        {AGENT: Measure(120.0, 900.0), TRITON: Measure(100.0, 1000.0)},  # 1.2 / 0.9
    ]
    row = summarize("case", rounds)
    assert row.medians == {AGENT: Measure(100.0, 1000.0), TRITON: Measure(100.0, 1000.0)}
    ratio = row.ratios[AGENT, TRITON]
    assert (ratio.rate, ratio.p50_us) == pytest.approx((1.2, 0.9))
    # Without Triton there is nothing to compare to.
    assert summarize("case", [{AGENT: Measure(1.0, 1.0)}]).ratios == {}


def test_the_agent_is_also_compared_to_its_pinned_threads() -> None:
    assert reference_pairs([AGENT, PINNED, AGENT_PYTHON, TRITON]) == [
        (AGENT, TRITON), (PINNED, TRITON), (AGENT_PYTHON, TRITON), (AGENT, PINNED),
    ]  # fmt: skip
    assert reference_pairs([AGENT, PINNED]) == [(AGENT, PINNED)]


def _cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]


def test_the_table_has_each_servers_figures_and_the_ratios() -> None:
    mlp = {AGENT: Measure(1500.0, 600.0), TRITON: Measure(1000.0, 900.0)}
    add_sub = {AGENT_PYTHON: Measure(800.0, 1200.0), TRITON: Measure(1000.0, 950.0)}
    rows = [summarize("MLP HTTP c=1", [mlp]), summarize("add_sub", [add_sub])]
    table = _cells(render(rows))
    assert table[0] == [
        "case", "agent inf/s", "agent p50 µs", "agent, Python backend inf/s",
        "agent, Python backend p50 µs", "Triton 2.51 inf/s", "Triton 2.51 p50 µs",
        "agent / Triton 2.51 inf/s", "agent / Triton 2.51 p50",
        "agent, Python backend / Triton 2.51 inf/s", "agent, Python backend / Triton 2.51 p50",
    ]  # fmt: skip
    assert table[2] == [
        "MLP HTTP c=1", "1,500", "600", "n/a", "n/a", "1,000", "900", "1.50", "0.67", "n/a", "n/a",
    ]  # fmt: skip
    assert table[3][1:3] == ["n/a", "n/a"]
    assert table[3][-2:] == ["0.80", "1.26"]


def test_the_python_models_config_is_the_onnx_one_on_the_python_backend(tmp_path: Path) -> None:
    model = MODELS["cnn"]
    text = python_config(model, tmp_path)
    assert 'backend: "python"' in text
    assert "platform" not in text
    assert "dynamic_batching" in text
    assert "count: 2" in text
    assert f'string_value: "{tmp_path}"' in text
    assert "bench_python_path" not in python_config(model, None)
    assert "bench_spinning" not in text
    assert 'key: "bench_spinning" value: { string_value: "1" }' in python_config(
        model, None, spinning=True
    )


def test_the_pinned_repository_pins_each_model_to_its_share_of_the_cores(tmp_path: Path) -> None:
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(b"")
    repo = write_onnx_repository(tmp_path, [MODELS["cnn"]], {"cnn": onnx_path}, pinned=True)
    text = (repo / "mobilenetv2" / "config.pbtxt").read_text()
    assert 'key: "intra_op_thread_count"' in text
    plain = write_onnx_repository(tmp_path, [MODELS["cnn"]], {"cnn": onnx_path})
    assert "intra_op_thread_count" not in (plain / "mobilenetv2" / "config.pbtxt").read_text()


def test_without_a_writable_triton_venv_triton_is_skipped_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-venv"
    reason = stub_onnxruntime(missing, "0.0.0")
    assert isinstance(reason, str)
    assert "no-venv" in reason or "python" in reason


def test_a_quick_real_run_measures_every_server_on_both_protocols(tmp_path: Path) -> None:
    binary = perf_analyzer()
    log: list[str] = []
    # Two of the perf_analyzer cases (one per protocol) keep it short; the rest differ only in
    # their numbers, which the unit tests above cover.
    rows, why_no_triton = run_compare(
        binary,
        rounds=1,
        quick=True,
        workdir=tmp_path,
        log=log.append,
        models=[MODELS["mlp"]],
        only=("MLP HTTP c=1", "MLP gRPC c=16"),
    )
    assert [r.case for r in rows] == [
        "MLP HTTP c=1", "MLP gRPC c=16", "add_sub, sequential tritonclient HTTP",
    ]  # fmt: skip
    assert all(rows[0].medians[s].rate > 0 for s in (AGENT, AGENT_PYTHON))
    assert set(rows[-1].medians) >= {AGENT_PYTHON}
    if why_no_triton:  # Triton (or onnxruntime for its stub) missing: the agent's figures only
        assert TRITON not in rows[0].medians
    else:
        assert rows[0].ratios[AGENT, TRITON].rate > 0
        assert rows[-1].medians[TRITON].rate > 0
