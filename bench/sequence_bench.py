"""`python -m bench.sequence_bench`: the sequence batcher under perf_analyzer's sequence load.

perf_analyzer drives the stateful accumulator (`bench.sequence_models`) over HTTP with
`--sequence-length`: each of its `concurrency` workers runs sequences of that many requests
(START on the first, END on the last, a correlation id per sequence). Servers:

    stateless  baseline: the same graph under the dynamic batcher; the client sends the state
               and the controls as plain inputs (no sequence bookkeeping, no state kept)
    direct     sequence_batching direct, 4 slots, 100 µs delay; the agent keeps the state
    oldest     sequence_batching oldest, 8 candidates, preferred 4, 100 µs delay

Per server: throughput, p50/p99 latency and the server's CPU time per request (utime+stime of
the server process around a fixed request count), so the cost of the batcher is read against
the baseline in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from bench.cpu_per_request import Point, Server, cpu_us, run_plan, server_command
from bench.perf import mean_latency_us, single_run_row
from bench.procs import REPO_ROOT
from bench.report import load_average, markdown_table
from bench.sequence_models import ACCUMULATOR_CONFIG, accumulator_model

SERVERS = ("stateless", "direct", "oldest")
_STRATEGY = {
    "direct": "direct { max_queue_delay_microseconds: 100 }",
    "oldest": "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 100"
    " preferred_batch_size: [ 4 ] }",
}
_STATELESS = """
name: "acc"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [
  { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "START" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] },
  { name: "S_IN" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4 ] }
"""


def write_repository(root: Path, server: str) -> Path:
    repo = root / server
    (repo / "acc" / "1").mkdir(parents=True)
    onnx.save(accumulator_model(), str(repo / "acc" / "1" / "model.onnx"))
    config = (
        _STATELESS
        if server == "stateless"
        else ACCUMULATOR_CONFIG.format(name="acc", strategy=_STRATEGY[server], idle_us=5_000_000)
    )
    (repo / "acc" / "config.pbtxt").write_text(config)
    return repo


def drive(
    binary: str, port: int, server: str, concurrency: int, requests: int, length: int, out: Path
) -> list[str]:
    command = [
        binary, "-m", "acc", "-u", f"127.0.0.1:{port}", "-i", "http",
        "--input-tensor-format", "binary", "--output-tensor-format", "binary",
        "--concurrency-range", str(concurrency), "-b", "1",
        "--request-count", str(requests), "-f", str(out),
    ]  # fmt: skip
    if server != "stateless":
        command += ["--sequence-length", str(length), "--sequence-length-variation", "0"]
    return command


def run_point(
    binary: str, server: Server, name: str, concurrency: int, requests: int, length: int, work: Path
) -> Point:
    out = work / f"{name}-c{concurrency}.csv"
    warm = drive(binary, server.port, name, concurrency, 200, length, work / "warm.csv")
    subprocess.run(warm, capture_output=True, check=True, timeout=300, cwd=REPO_ROOT)
    before = cpu_us(server.pid)
    done = subprocess.run(
        drive(binary, server.port, name, concurrency, requests, length, out),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=REPO_ROOT,  # .venv-perf/bin/perf_analyzer is a wrapper with a relative path
    )
    after = cpu_us(server.pid)
    row = single_run_row(done, out)
    return Point(
        server=name,
        concurrency=concurrency,
        requests=requests,
        server_us=(after - before) / requests,
        client_us=0.0,
        avg_us=mean_latency_us(done.stdout),  # throughput by Little's law, as cpu_per_request
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
    )


def render(points: Sequence[Point]) -> str:
    rows = [
        [
            p.server,
            str(p.concurrency),
            f"{p.requests:,}",
            f"{p.server_us:.0f}",
            f"{p.throughput:,.0f}",
            f"{p.p50_us:.0f}",
            f"{p.p99_us:.0f}",
        ]
        for p in points
    ]
    header = ["server", "conc", "requests", "server CPU µs/req", "inf/s", "p50 µs", "p99 µs"]
    return markdown_table(header, rows, [False] + [True] * 6)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma list of %(default)s")
    parser.add_argument("--concurrency", default="8", help="comma list (default %(default)s)")
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--sequence-length", type=int, default=5)
    parser.add_argument("--perf-analyzer", default=None, help="the perf_analyzer binary")
    args = parser.parse_args(argv)
    plan = run_plan(parser, args, SERVERS)
    if plan is None:
        return 2
    servers, binary, concurrency = plan
    points: list[Point] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="sequence-bench-") as tmp:
        root = Path(tmp)
        repos = {name: write_repository(root, name) for name in servers}
        for name in servers:
            server = Server(server_command(name, repos, ["--intra-op-threads", "1"]))
            try:
                for c in concurrency:
                    point = run_point(
                        binary, server, name, c, args.requests, args.sequence_length, root
                    )
                    print(f"{name} c={c}: {point.throughput:,.0f} inf/s", file=sys.stderr)
                    points.append(point)
            finally:
                server.stop()
    print(render(points))
    print(
        f"\nsequence length {args.sequence_length}; load average before/after: "
        f"{load_before:.2f} / {load_average():.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
