"""bench.cpu_per_inference and bench.targets: the pieces behind `make bench`'s issue-18 ratios."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from bench.cpu_per_inference import (
    AgentCpu,
    Counters,
    CpuPoint,
    raw_cpu_per_call_us,
    raw_cpu_per_inference_us,
    raw_sessions,
    read_counters,
    render,
)
from bench.cpu_per_request import Point, Server
from bench.models import MODELS, write_model_files, write_repository
from bench.perf import LoadResult
from bench.targets import grpc_http_table, mlp_cpu_table
from tests.server import explicit_agent, http_client


def test_counters_from_the_statistics_endpoint_give_the_batch_mix(tmp_path: Path) -> None:
    model = MODELS["mlp"]
    onnx_path = write_model_files(tmp_path, [model])["mlp"]
    repo = write_repository(tmp_path, model, "dynbatch", onnx_path)
    rng = np.random.default_rng(0)
    with explicit_agent(repo) as agent, http_client(agent) as client:
        url = f"127.0.0.1:{agent.http_port}"
        client.infer(model.served_name, [_input(model.sample(2, rng))])  # before the window
        before = read_counters(url, model.served_name)
        for rows in (1, 3, 3):  # one at a time: each runs as a batch of its own
            client.infer(model.served_name, [_input(model.sample(rows, rng))])
        delta = read_counters(url, model.served_name).minus(before)
    assert delta == Counters(inferences=7, executions=3, batches={1: 1, 3: 2})
    assert delta.mean_batch == 7 / 3


def _input(array: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=True)
    return tensor


def test_raw_cpu_per_inference_weights_each_batch_size_by_its_rows() -> None:
    per_call = {1: 100.0, 4: 320.0, 8: 560.0}  # µs per call: 100, 80, 70 per row
    asked: list[int] = []

    def measure(batch: int) -> float:
        asked.append(batch)
        return per_call[batch]

    # 10 batches of 8, 5 of 4, 20 of 1: 80, 20, 20 rows.
    mix = {8: 10, 4: 5, 1: 20}
    assert raw_cpu_per_inference_us(mix, measure) == (80 * 70 + 20 * 80 + 20 * 100) / 120
    assert sorted(asked) == [1, 4, 8]
    # A rare size (2% of the rows here) is not measured: it counts at the nearest size's cost.
    asked.clear()
    rare = {8: 100, 1: 16}  # 800 + 16 rows
    assert raw_cpu_per_inference_us(rare, measure, coverage=0.95) == 70.0
    assert asked == [8]


def test_raw_cpu_per_call_runs_the_sessions_side_by_side(tmp_path: Path) -> None:
    model = MODELS["mlp"]
    onnx_path = write_model_files(tmp_path, [model])["mlp"]
    sessions = raw_sessions(onnx_path, instances=2, intra_op_threads=1)
    assert len(sessions) == 2
    us = raw_cpu_per_call_us(sessions, model, batch=4, budget_s=0.05, min_calls=5)
    assert 0 < us < 50_000


def test_cnn_table_shows_the_ratio_against_its_target() -> None:
    cpu = AgentCpu(cpu_us=1_100_000, busiest_us=1_000_000, counters=Counters(100, 25, {4: 25}))
    table = render([CpuPoint("http", 16, cpu, 10_000.0), CpuPoint("grpc", 32, cpu, 10_500.0)])
    http, grpc = _cells(table)[2:]
    assert http == [
        *("http", "16", "100", "4.00", "11,000", "10,000", "1,000", "10,000"),
        *("1.100", "<= 1.05 (missed)"),
    ]
    assert grpc[-2:] == ["1.048", "<= 1.05 (met)"]


def _cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]


def test_grpc_http_and_mlp_cpu_tables_mark_targets_met_or_missed() -> None:
    def result(c: int, rate: float, p50: float) -> LoadResult:
        return LoadResult(c, rate, p50, p50, p50, ())

    http = {"mlp": {1: result(1, 500, 1000), 16: result(16, 2000, 8000)}}
    grpc = {"mlp": {1: result(1, 450, 1100), 16: result(16, 2200, 7000)}}
    table = grpc_http_table([MODELS["mlp"]], [1, 16], http, grpc)
    c1, c16 = _cells(table)[2:]
    # Ratios without a verdict: bench.latency_pairs judges both targets on alternating pairs.
    assert c1 == [*("mlp", "1", "500", "450", "0.90"), *("1,000", "1,100", "1.10")]
    assert c16 == [*("mlp", "16", "2,000", "2,200", "1.10"), *("8,000", "7,000", "0.88")]
    assert "met" not in table

    def point(server: str, us: float) -> Point:
        return Point(server, 16, 1000, us, 50.0, 900.0, 2000.0, 8000.0)

    cpu = mlp_cpu_table(
        {"floor": point("floor", 100), "nobatch": point("nobatch", 190), "nobatch-grpc": "boom"}
    )
    floor, agent_http, agent_grpc = _cells(cpu)[2:]
    assert floor[4:] == ["1.00", ""]
    assert agent_http[1:] == ["190", "0.0", "2,000", "1.90", "<= 2.00 (met)"]
    assert agent_grpc[:2] == ["agent, gRPC", "failed"]


def test_floor_server_answers_with_the_cnn_shapes() -> None:
    model = MODELS["cnn"]
    server = Server([sys.executable, "-m", "bench.floor_server", "--port", "0", "--model", "cnn"])
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        metadata = client.get_model_metadata(model.served_name)
        assert metadata["inputs"][0]["shape"] == [-1, 3, 224, 224]
        image = np.zeros((1, *model.input_dims), dtype=np.float32)
        result = client.infer(model.served_name, [_input(image)])
        assert result.as_numpy("OUTPUT0").shape == (1, 1000)
        client.close()
    finally:
        server.stop()
