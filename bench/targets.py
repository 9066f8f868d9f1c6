"""Issue 18's performance targets as ratios measured in one `python -m bench` run.

On a shared machine absolute figures drift from run to run; a ratio of two figures taken in the
same run, on the same cores, moves far less. Each table here puts the ratio next to its target:

* gRPC vs HTTP, dynamic batching: both protocols' inf/s and p50 at every concurrency, one run
  each, without a verdict;
* gRPC inf/s >= HTTP's at c=16 and gRPC p50 <= HTTP's at c=1 (MLP, dynamic batching), judged on
  the median gRPC / HTTP ratios of alternating pairs of runs against one agent
  (bench.latency_pairs): one pair of runs is a coin toss on a shared machine;
* the agent's CPU per MLP request without batching at c=16, over HTTP and gRPC, <= 2x the
  floor (bench.floor_server: aiohttp answering a fixed body), via bench.cpu_per_request;
* the agent's CPU per CNN inference with dynamic batching <= 1.05x in-process ONNX Runtime's at
  the batch sizes the batcher formed (bench.cpu_per_inference).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import latency_pairs
from bench.cpu_per_inference import (
    AgentCpu,
    CpuPoint,
    RawCache,
    fmt_target,
    notes,
    raw_cpu_per_inference_us,
    raw_sessions,
    render,
)
from bench.cpu_per_request import Point, Server, run_point, server_command
from bench.latency_pairs import Pair
from bench.models import BenchModel, instances
from bench.perf import LoadResult
from bench.procs import BenchError
from bench.report import fmt_rate, markdown_table

MLP_CPU_TARGET = 2.0  # agent CPU per request <= 2x the aiohttp floor
MLP_CPU_CONCURRENCY = 16
MLP_CPU_SERVERS = ("floor", "nobatch", "nobatch-grpc")
CNN_CPU_MODELS = ("cnn",)  # the compute-bound model the 1.05 target is about
CNN_CPU_MIN_CONCURRENCY = 16  # CPU per inference at these concurrencies and up

Results = Mapping[str, Mapping[int, LoadResult | str]]  # model key -> concurrency -> result


@dataclass(slots=True)
class Targets:
    """The measurements behind the ratio tables that the main table does not hold."""

    mlp_cpu: dict[str, Point | str] = field(default_factory=dict)  # server -> point or error
    cnn_cpu: dict[str, list[CpuPoint]] = field(default_factory=dict)  # model key -> points
    cnn_floor: dict[str, Point | str] = field(default_factory=dict)  # model key -> floor
    latency_pairs: list[Pair] | str | None = None  # MLP HTTP/gRPC pairs, or the error
    latency_pair_requests: int = 0  # per run in those pairs


def _ratio_cells(
    http: LoadResult | str | None, grpc: LoadResult | str | None, *, latency: bool
) -> tuple[str, str, str, float | None]:
    if not isinstance(http, LoadResult) or not isinstance(grpc, LoadResult):
        return "n/a", "n/a", "n/a", None
    if latency:
        ratio = grpc.p50_us / http.p50_us if http.p50_us else None
        cells = f"{http.p50_us:,.0f}", f"{grpc.p50_us:,.0f}"
    else:
        ratio = grpc.throughput / http.throughput if http.throughput else None
        cells = fmt_rate(http.throughput), fmt_rate(grpc.throughput)
    return *cells, ("n/a" if ratio is None else f"{ratio:.2f}"), ratio


def grpc_http_table(
    models: Sequence[BenchModel], concurrency: Sequence[int], http: Results, grpc: Results
) -> str:
    """gRPC / HTTP throughput and p50 ratios at every concurrency, dynbatch runs, one run per
    protocol: no verdict (bench.latency_pairs judges both targets on alternating pairs)."""
    rows: list[list[str]] = []
    for model in models:
        for c in concurrency:
            h = http.get(model.key, {}).get(c)
            g = grpc.get(model.key, {}).get(c)
            h_rate, g_rate, rate_text, _ = _ratio_cells(h, g, latency=False)
            h_p50, g_p50, p50_text, _ = _ratio_cells(h, g, latency=True)
            rows.append([model.key, str(c), h_rate, g_rate, rate_text, h_p50, g_p50, p50_text])
    headers = [
        "model", "conc", "HTTP inf/s", "gRPC inf/s", "gRPC / HTTP inf/s",
        "HTTP p50 µs", "gRPC p50 µs", "gRPC p50 / HTTP p50",
    ]  # fmt: skip
    return markdown_table(headers, rows, [False] + [True] * 7)


def run_mlp_cpu(
    binary: str,
    nobatch_repo: Path,
    requests: int,
    workdir: Path,
    log: Callable[[str], None],
) -> dict[str, Point | str]:
    """bench.cpu_per_request's floor, nobatch and nobatch-grpc servers at c=16 (str: the error)."""
    points: dict[str, Point | str] = {}
    for name in MLP_CPU_SERVERS:
        try:
            server = Server(server_command(name, {"nobatch": nobatch_repo}, []))
            try:
                point = run_point(binary, server, name, MLP_CPU_CONCURRENCY, requests, workdir)
            finally:
                server.stop()
        except (BenchError, OSError, ValueError, subprocess.SubprocessError) as exc:
            points[name] = str(exc)
            log(f"[mlp cpu] {name}: FAILED: {exc}")
            continue
        points[name] = point
        log(
            f"[mlp cpu] {name} c={MLP_CPU_CONCURRENCY}: {point.server_us:.0f} µs CPU/request "
            f"({requests} requests)"
        )
    return points


def run_latency_pairs(
    binary: str,
    dynbatch_repo: Path,
    rounds: int,
    requests: int,
    intra_op_threads: int,
    workdir: Path,
    log: Callable[[str], None],
) -> list[Pair] | str:
    """bench.latency_pairs' alternating HTTP/gRPC pairs at c=1 on one agent (str: the error)."""
    try:
        return latency_pairs.run_pairs(
            binary, dynbatch_repo, rounds, requests, workdir, log,
            ["--intra-op-threads", str(intra_op_threads)],
        )  # fmt: skip
    except (BenchError, OSError, ValueError, subprocess.SubprocessError) as exc:
        log(f"[latency pairs] FAILED: {exc}")
        return str(exc)


def mlp_cpu_table(points: Mapping[str, Point | str]) -> str:
    """Server CPU per request and its ratio to the floor, with the 2x target."""
    floor = points.get("floor")
    floor_us = floor.server_us if isinstance(floor, Point) else 0.0
    labels = {"floor": "floor (aiohttp, fixed body)", "nobatch": "agent, HTTP"}
    labels["nobatch-grpc"] = "agent, gRPC"
    rows: list[list[str]] = []
    for name in MLP_CPU_SERVERS:
        point = points.get(name)
        if not isinstance(point, Point):
            rows.append([labels[name], "failed", "", "", "", ""])
            continue
        ratio = point.server_us / floor_us if floor_us else None
        rows.append(
            [
                labels[name],
                f"{point.server_us:,.0f}",
                f"{point.switches:.1f}",
                f"{point.throughput:,.0f}",
                "n/a" if ratio is None else f"{ratio:.2f}",
                "" if name == "floor" or ratio is None else fmt_target(ratio, "<=", MLP_CPU_TARGET),
            ]
        )
    return markdown_table(
        ["server", "server CPU µs/req", "switches/req", "inf/s", "/ floor", "target"],
        rows,
        [False] + [True] * 5,
    )


def run_cnn_floor(
    binary: str, model: BenchModel, requests: int, workdir: Path, log: Callable[[str], None]
) -> Point | str:
    """bench.floor_server with the CNN's shapes at c=16: aiohttp reading each request's tensor
    and answering a fixed response, the transport's floor per request (str: the error)."""
    command = [sys.executable, "-m", "bench.floor_server", "--port", "0", "--model", model.key]
    try:
        server = Server(command)
        try:
            point = run_point(
                binary, server, "floor", CNN_CPU_MIN_CONCURRENCY, requests, workdir,
                model.served_name,
            )  # fmt: skip
        finally:
            server.stop()
    except (BenchError, OSError, ValueError, subprocess.SubprocessError) as exc:
        log(f"[{model.key}] floor: FAILED: {exc}")
        return str(exc)
    log(
        f"[{model.key}] aiohttp floor c={CNN_CPU_MIN_CONCURRENCY}: {point.server_us:.0f} µs/request"
    )
    return point


def cnn_cpu_points(
    runs: Mapping[str, Mapping[int, AgentCpu]],
    onnx_path: Path,
    model: BenchModel,
    instances: int,
    threads: int,
    budget_s: float,
    min_calls: int,
    log: Callable[[str], None],
) -> list[CpuPoint]:
    """Raw ORT at each run's batch mix, next to the agent's CPU per inference.

    `runs`: protocol -> concurrency -> the agent's CPU over that perf_analyzer run.
    """
    sessions: list[Any] = raw_sessions(onnx_path, instances, threads)
    raw = RawCache(sessions, model, budget_s, min_calls)
    points: list[CpuPoint] = []
    for protocol, by_concurrency in runs.items():
        for c, cpu in sorted(by_concurrency.items()):
            if c < CNN_CPU_MIN_CONCURRENCY or not cpu.counters.batches:
                continue
            raw_us = raw_cpu_per_inference_us(cpu.counters.batches, raw)
            point = CpuPoint(protocol, c, cpu, raw_us)
            points.append(point)
            log(
                f"[{model.key}] CPU per inference, {protocol} c={c}: agent "
                f"{cpu.us_per_inference:,.0f} µs (mean batch {cpu.counters.mean_batch:.2f}), "
                f"raw ORT {raw_us:,.0f} µs: {point.ratio:.3f}"
            )
    return points


def render_targets(
    models: Sequence[BenchModel],
    concurrency: Sequence[int],
    http: Results,
    grpc: Results,
    extra: Targets,
    mlp_cpu_requests: int,
    threads: Callable[[BenchModel], int],
) -> list[str]:
    """The ratio tables, each ratio next to its target; `http`/`grpc`: the dynbatch runs,
    `threads(model)`: intra-op threads per dynbatch instance."""
    parts = [
        "gRPC vs HTTP, dynamic batching, same run, one run per protocol (no verdict: the MLP's "
        "targets, gRPC inf/s >= HTTP's at c=16 and gRPC p50 <= HTTP's at c=1, are judged by "
        "the alternating pairs below):",
        "",
        grpc_http_table(models, concurrency, http, grpc),
        "",
        *_latency_pairs_part(extra),
    ]
    if extra.mlp_cpu:
        parts += [
            f"Agent CPU per MLP request, no batching, c={MLP_CPU_CONCURRENCY} "
            f"(bench.cpu_per_request, {mlp_cpu_requests:,} requests per server; target: "
            f"<= {MLP_CPU_TARGET:g}x the floor, an aiohttp server answering a fixed body):",
            "",
            mlp_cpu_table(extra.mlp_cpu),
            "",
        ]
    for key, points in extra.cnn_cpu.items():
        model = next(m for m in models if m.key == key)
        parts += [
            f"Agent CPU per {key} inference vs in-process ONNX Runtime at the batch sizes the "
            "batcher formed (dynbatch; target: agent / raw <= 1.05):",
            "",
            render(points) if points else "(no run at c >= 16 completed)",
            "",
            notes(threads(model), instances(model, "dynbatch")),
            _floor_note(model, extra.cnn_floor.get(key), points),
            "",
        ]
    return parts


def _latency_pairs_part(extra: Targets) -> list[str]:
    """bench.latency_pairs' table (the c=1 p50 target), or why it is missing."""
    pairs = extra.latency_pairs
    if pairs is None:
        return []
    if isinstance(pairs, str) or not pairs:
        reason = pairs.splitlines()[0] if isinstance(pairs, str) and pairs else "no round ran"
        return [f"gRPC vs HTTP p50 at c=1 (bench.latency_pairs): not measured ({reason}).", ""]
    return [
        latency_pairs.caption(len(pairs), extra.latency_pair_requests),
        "",
        latency_pairs.render(pairs),
        "",
    ]


def _floor_note(model: BenchModel, floor: Point | str | None, points: Sequence[CpuPoint]) -> str:
    """The transport's floor for the same requests, against raw ORT's CPU per inference."""
    what = (
        f"- aiohttp floor for the same requests (bench.floor_server --model {model.key}: reads "
        "each request's tensor, answers a fixed response), "
        f"c={CNN_CPU_MIN_CONCURRENCY}: "
    )
    if not isinstance(floor, Point):
        return what + "not measured" + (f" ({floor.splitlines()[0]})" if floor else "") + "."
    raws = sorted(p.raw_us for p in points)
    share = (
        f" = {floor.server_us / raws[len(raws) // 2]:.1%} of raw ORT's CPU per inference"
        if raws
        else ""
    )
    return f"{what}{floor.server_us:,.0f} µs CPU per request{share}: aiohttp's own share."
