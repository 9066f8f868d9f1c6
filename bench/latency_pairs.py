"""`python -m bench.latency_pairs`: gRPC against HTTP in alternating pairs: p50 at c=1 and
throughput at c=16.

Issue 18's targets "gRPC p50 <= HTTP p50 at c=1" and "gRPC inf/s >= HTTP inf/s at c=16" (the
benchmark MLP, dynamic batching: preferred 8/16/32, 300 µs queue delay) cannot be read from one
HTTP run and one gRPC run on a shared machine: with a 300 µs batching delay a c=1 point mostly
measures how late the machine wakes a sleeping thread, and one pair of runs gave anything from
0.38 to 1.73 against the same agent; at c=16 the same two servers measured 0.70-1.42 from one
run to the next (bench/HISTORY.md). So ONE agent serves both protocols, and each round runs
perf_analyzer over HTTP (binary tensors) and over gRPC, batch 1, a fixed `--request-count`, at
c=1 and at c=16, the protocol order swapped every round so neither always runs on a warmer or
colder machine. Each target is judged on the median of the rounds' gRPC / HTTP ratios, which
moves far less than single pairs do.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.cpu_per_inference import fmt_target
from bench.cpu_per_request import (
    WARMUP_REQUESTS,
    Server,
    drive,
    run_counted_retrying,
    server_command,
)
from bench.models import write_mlp_repositories
from bench.perf import find_perf_analyzer, mean_latency_us, single_run_row
from bench.procs import BenchError
from bench.report import load_average, markdown_table

TARGET = 1.0  # gRPC p50 / HTTP p50 <= this, on the median of the pairs
THROUGHPUT_TARGET = 1.0  # gRPC inf/s / HTTP inf/s >= this at THROUGHPUT_AT, on the median
THROUGHPUT_AT = 16
THROUGHPUT_REQUESTS_FACTOR = 4  # c=16 runs send this many times the c=1 runs' requests
DEFAULT_ROUNDS = 9
DEFAULT_REQUESTS = 1500
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True, slots=True)
class Pair:
    """One round: HTTP and gRPC against the same agent, back to back: p50 at c=1, inf/s at
    c=16 (0: not measured)."""

    first: str  # the protocol that ran first in this round
    http_p50_us: float
    grpc_p50_us: float
    http_inf_s: float = 0.0
    grpc_inf_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-pair gRPC / HTTP ratios and their medians."""

    ratios: tuple[float, ...]  # p50 at c=1
    median_ratio: float
    median_http_us: float
    median_grpc_us: float
    grpc_not_slower: int  # pairs with gRPC p50 <= HTTP p50
    throughput_ratios: tuple[float, ...] = ()  # inf/s at c=16 (pairs that measured it)
    median_throughput_ratio: float | None = None
    median_http_inf_s: float | None = None
    median_grpc_inf_s: float | None = None

    @property
    def met(self) -> bool:
        return self.median_ratio <= TARGET

    @property
    def throughput_met(self) -> bool | None:
        if self.median_throughput_ratio is None:
            return None
        return self.median_throughput_ratio >= THROUGHPUT_TARGET


def summarize(pairs: Sequence[Pair]) -> Summary:
    """The ratios of each pair and their medians; BenchError without a usable pair."""
    usable = [p for p in pairs if p.http_p50_us > 0]
    if not usable:
        raise BenchError("no pair with an HTTP p50 to compare against")
    ratios = tuple(p.grpc_p50_us / p.http_p50_us for p in usable)
    rated = [p for p in pairs if p.http_inf_s > 0]
    throughput = tuple(p.grpc_inf_s / p.http_inf_s for p in rated)  # as _rate_ratio
    return Summary(
        ratios=ratios,
        median_ratio=statistics.median(ratios),
        median_http_us=statistics.median(p.http_p50_us for p in usable),
        median_grpc_us=statistics.median(p.grpc_p50_us for p in usable),
        grpc_not_slower=sum(r <= 1.0 for r in ratios),
        throughput_ratios=throughput,
        median_throughput_ratio=statistics.median(throughput) if throughput else None,
        median_http_inf_s=statistics.median(p.http_inf_s for p in rated) if rated else None,
        median_grpc_inf_s=statistics.median(p.grpc_inf_s for p in rated) if rated else None,
    )


def order(round_index: int) -> tuple[str, str]:
    """HTTP first in even rounds, gRPC first in odd ones."""
    return PROTOCOLS if round_index % 2 == 0 else PROTOCOLS[::-1]


def render(pairs: Sequence[Pair]) -> str:
    """One row per round, then the median row with the targets."""
    summary = summarize(pairs)
    rows = [
        [
            *(str(i), p.first, f"{p.http_p50_us:,.0f}", f"{p.grpc_p50_us:,.0f}", f"{ratio:.2f}"),
            "",
            *_rate_cells(p.http_inf_s, p.grpc_inf_s, _rate_ratio(p)),
            "",
        ]
        for i, (p, ratio) in enumerate(zip(pairs, summary.ratios, strict=True), start=1)
    ]
    throughput = summary.median_throughput_ratio
    rows.append(
        [
            *("median", "", f"{summary.median_http_us:,.0f}", f"{summary.median_grpc_us:,.0f}"),
            _median_text(summary.median_ratio, TARGET),
            fmt_target(summary.median_ratio, "<=", TARGET),
            *_rate_cells(summary.median_http_inf_s, summary.median_grpc_inf_s, throughput)[:2],
            "n/a" if throughput is None else _median_text(throughput, THROUGHPUT_TARGET),
            "" if throughput is None else fmt_target(throughput, ">=", THROUGHPUT_TARGET),
        ]
    )
    headers = [
        "round", "first", "HTTP p50 µs", "gRPC p50 µs", "gRPC / HTTP", "target",
        f"HTTP c={THROUGHPUT_AT} inf/s", f"gRPC c={THROUGHPUT_AT} inf/s", "gRPC / HTTP inf/s",
        "target",
    ]  # fmt: skip
    return markdown_table(headers, rows, [False, False] + [True] * 8)


def _median_text(ratio: float, target: float) -> str:
    """Two decimals; three when two would show the target itself for a ratio that is not."""
    text = f"{ratio:.2f}"
    return f"{ratio:.3f}" if text == f"{target:.2f}" and ratio != target else text


def _rate_ratio(pair: Pair) -> float | None:
    return pair.grpc_inf_s / pair.http_inf_s if pair.http_inf_s > 0 else None


def _rate_cells(http: float | None, grpc: float | None, ratio: float | None) -> list[str]:
    if not http or grpc is None or ratio is None:
        return ["n/a", "n/a", "n/a"]
    return [f"{http:,.0f}", f"{grpc:,.0f}", f"{ratio:.2f}"]


def caption(rounds: int, requests: int) -> str:
    """The line above the table: what was run and why it is judged this way."""
    return (
        f"gRPC vs HTTP in alternating pairs, MLP with dynamic batching (bench.latency_pairs): one "
        f"agent serving both, {rounds} rounds of {requests:,} requests per protocol at c=1 and "
        f"{requests * THROUGHPUT_REQUESTS_FACTOR:,} at c={THROUGHPUT_AT}, the order swapped every "
        "round; targets: the median gRPC / HTTP p50 ratio at c=1 <= 1.00 and the median gRPC / "
        f"HTTP inf/s ratio at c={THROUGHPUT_AT} >= 1.00 (a single pair swings 0.4-1.7 on a "
        "shared machine, the median of alternating pairs moves far less):"
    )


def run_pairs(
    binary: str,
    repo: Path,
    rounds: int,
    requests: int,
    workdir: Path,
    log: Callable[[str], None],
    agent_args: Sequence[str] = (),
    model: str = "mlp",
) -> list[Pair]:
    """Start one agent on `repo` (HTTP and gRPC) and run `rounds` alternating pairs against it."""
    server = Server(server_command("dynbatch-grpc", {"dynbatch": repo}, agent_args))
    try:
        if not server.grpc_port:
            raise BenchError("the agent logged no gRPC port")
        ports = {"http": server.port, "grpc": server.grpc_port}
        for protocol in PROTOCOLS:  # connections, first-call allocations, ORT's first runs
            warm_csv = workdir / "warm.csv"
            warm = drive(binary, ports[protocol], 1, WARMUP_REQUESTS, warm_csv, protocol, model)
            run_counted_retrying(warm, WARMUP_REQUESTS).check_returncode()
        pairs: list[Pair] = []
        many = requests * THROUGHPUT_REQUESTS_FACTOR
        for i in range(rounds):
            p50: dict[str, float] = {}
            rate: dict[str, float] = {}
            for protocol in order(i):
                port = ports[protocol]
                csv_path = workdir / f"pair-{i}-{protocol}.csv"
                command = drive(binary, port, 1, requests, csv_path, protocol, model)
                row = single_run_row(run_counted_retrying(command, requests), csv_path)
                p50[protocol] = float(row["p50 latency"])
                csv_path = workdir / f"pair-{i}-{protocol}-c{THROUGHPUT_AT}.csv"
                command = drive(binary, port, THROUGHPUT_AT, many, csv_path, protocol, model)
                done = run_counted_retrying(command, many)
                single_run_row(done, csv_path)  # its checks
                # perf_analyzer's own rate moves in whole seconds with a fixed request count:
                # Little's law, as bench.cpu_per_request reads it.
                rate[protocol] = THROUGHPUT_AT / mean_latency_us(done.stdout) * 1e6
            pairs.append(Pair(order(i)[0], p50["http"], p50["grpc"], rate["http"], rate["grpc"]))
            log(
                f"[latency pairs] round {i + 1}/{rounds}: c=1 p50 HTTP {p50['http']:,.0f} µs, "
                f"gRPC {p50['grpc']:,.0f} µs, ratio {p50['grpc'] / p50['http']:.2f}; "
                f"c={THROUGHPUT_AT} HTTP {rate['http']:,.0f} inf/s, gRPC {rate['grpc']:,.0f} "
                f"inf/s, ratio {rate['grpc'] / rate['http']:.2f}"
            )
        return pairs
    finally:
        server.stop()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per run")
    parser.add_argument("--perf-analyzer", default=None, help="the perf_analyzer binary")
    parser.add_argument(
        "--agent-arg", action="append", default=[], help="extra `agent serve` argument (repeat)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    binary = find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        print("perf_analyzer not found (--perf-analyzer or $PERF_ANALYZER)", file=sys.stderr)
        return 2
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="latency-pairs-") as tmp:
        root = Path(tmp)
        repo = write_mlp_repositories(root, "dynbatch")["dynbatch"]
        try:
            pairs = run_pairs(binary, repo, args.rounds, args.requests, root, _log, args.agent_arg)
        except (BenchError, OSError, subprocess.SubprocessError) as exc:
            print(f"latency pairs: error: {exc}", file=sys.stderr)
            return 1
    print(caption(args.rounds, args.requests))
    print()
    print(render(pairs))
    print(f"\nload average before/after: {load_before:.2f} / {load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
