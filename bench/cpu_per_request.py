"""`python -m bench.cpu_per_request`: the agent's CPU time per inference request over HTTP.

Throughput on a shared 2-core machine moves with whatever else runs; the CPU time the server
process spends per request moves far less, so this is the figure to compare changes by. For each
server and concurrency it reads the server's utime+stime from /proc/PID/stat, sends a fixed
number of requests with perf_analyzer (HTTP, binary tensors, batch 1) and reads it again:
µs CPU per request = delta / requests. perf_analyzer's own CPU is reported too (it is a child of
this process: the RUSAGE_CHILDREN delta around its run). Voluntary context switches per request
(all the server's threads, /proc/PID/task/*/status) count thread hand-offs: unlike CPU time they
barely move with the machine's load.

Servers, each on the benchmark MLP (bench.models):
    floor     bench.floor_server: aiohttp answering with a fixed body (no model, no agent code)
    nobatch   the agent, no scheduler block
    dynbatch  the agent with dynamic batching (preferred 8/16/32, 300 µs delay)
    nobatch-grpc, dynbatch-grpc   the same agents driven over gRPC (`perf_analyzer -i grpc`),
                  the default engine (loop: HTTP/2 on the event loop)
    nobatch-grpcio, dynbatch-grpcio   the same over gRPC with `--grpc-engine grpcio` (grpc.aio)
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.models import write_mlp_repositories
from bench.perf import find_perf_analyzer, mean_latency_us, single_run_row
from bench.procs import REPO_ROOT, BenchError, stop_process
from bench.report import load_average, markdown_table

SERVERS = (
    "floor",
    "nobatch",
    "dynbatch",
    "nobatch-grpc",
    "dynbatch-grpc",
    "nobatch-grpcio",
    "dynbatch-grpcio",
)
_LISTENING = re.compile(r"listening on http://([^\s:]+):(\d+)")
_GRPC = re.compile(r"gRPC on ([^\s:]+):(\d+)")
TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")
WARMUP_REQUESTS = 500


@dataclass(frozen=True, slots=True)
class Point:
    """One server at one concurrency."""

    server: str
    concurrency: int
    requests: int
    server_us: float  # server CPU per request
    client_us: float  # perf_analyzer CPU per request
    p50_us: float
    p99_us: float

    avg_us: float
    switches: float = 0.0  # the server's voluntary context switches per request (0: not read)

    @property
    def throughput(self) -> float:
        """Little's law, concurrency / mean latency: perf_analyzer's own figure and its run time
        move in whole seconds when it sends a fixed number of requests."""
        return self.concurrency / self.avg_us * 1e6


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches of all of a process's threads (those alive now)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text(encoding="ascii")
        except OSError:  # the thread ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def cpu_us(pid: int) -> float:
    """utime + stime of a process, in microseconds (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_US


class Server:
    """A server child process started with `command`; the port comes from its log line."""

    def __init__(self, command: list[str], start_timeout_s: float = 120.0) -> None:
        self.port = 0
        self.grpc_port = 0  # logged before "listening on"
        self._tail: collections.deque[str] = collections.deque(maxlen=30)
        self._listening = threading.Event()
        self._proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        try:
            threading.Thread(target=self._drain, daemon=True).start()
            deadline = time.monotonic() + start_timeout_s
            while not self._listening.wait(0.1):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise BenchError("server did not start:\n" + "\n".join(self._tail))
        except BaseException:
            stop_process(self._proc, grace_s=10)
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._tail.append(line.rstrip())
            grpc_match = _GRPC.search(line)
            if grpc_match:
                self.grpc_port = int(grpc_match.group(2))
            match = _LISTENING.search(line)
            if match and not self._listening.is_set():
                self.port = int(match.group(2))
                self._listening.set()

    def stop(self) -> None:
        stop_process(self._proc, grace_s=20)


def server_command(name: str, repos: dict[str, Path], extra: Sequence[str]) -> list[str]:
    if name == "floor":
        return [sys.executable, "-m", "bench.floor_server", "--port", "0"]
    grpc_port = "0" if _is_grpc(name) else "-1"
    engine = ["--grpc-engine", "grpcio"] if name.endswith("-grpcio") else []
    return [
        sys.executable, "-m", "agent", "serve", "--model-repository", str(repos[_repo(name)]),
        "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", grpc_port,
        "--metrics-port", "-1", *engine, *extra,
    ]  # fmt: skip


def _is_grpc(name: str) -> bool:
    return name.endswith(("-grpc", "-grpcio"))


def _repo(name: str) -> str:
    return name.removesuffix("-grpcio").removesuffix("-grpc")


def drive(
    binary: str,
    port: int,
    concurrency: int,
    requests: int,
    csv_path: Path,
    protocol: str = "http",
    model: str = "mlp",
) -> list[str]:
    """The perf_analyzer command for `requests` requests of `model` at `concurrency`."""
    formats = (
        ["--input-tensor-format", "binary", "--output-tensor-format", "binary"]
        if protocol == "http"
        else []
    )
    return [
        binary, "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol, *formats,
        "--concurrency-range", str(concurrency), "-b", "1",
        "--request-count", str(requests), "-f", str(csv_path),
    ]  # fmt: skip


# perf_analyzer's --request-count now and then never ends (its last worker asleep, against any
# server, the aiohttp floor included): such a run is cut off and made again.
_ATTEMPTS = 3


def _time_limit_s(requests: int) -> float:
    # 200 requests/s at the least: far slower than any server here. perf_analyzer 2.51 now and
    # then never exits after its last request (its workers gone, the server idle): a short
    # limit keeps that cheap.
    return 20.0 + requests * 0.005


def _run_counted(command: list[str], requests: int) -> subprocess.CompletedProcess[str]:
    """One --request-count perf_analyzer run; TimeoutExpired when it hangs."""
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        timeout=_time_limit_s(requests),
        cwd=REPO_ROOT,  # .venv-perf/bin/perf_analyzer is a wrapper with a relative path
    )


def _hung(attempt: int) -> None:
    print(f"perf_analyzer hung (try {attempt} of {_ATTEMPTS}); cut off", file=sys.stderr)


def run_counted_retrying(command: list[str], requests: int) -> subprocess.CompletedProcess[str]:
    """A --request-count perf_analyzer run, made again (up to _ATTEMPTS tries) when it hangs;
    TimeoutExpired when every try hung."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return _run_counted(command, requests)
        except subprocess.TimeoutExpired:
            _hung(attempt)
            if attempt == _ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def run_point(
    binary: str,
    server: Server,
    name: str,
    concurrency: int,
    requests: int,
    workdir: Path,
    model: str = "mlp",
) -> Point:
    csv_path = workdir / f"{name}-c{concurrency}.csv"
    protocol = "grpc" if _is_grpc(name) else "http"
    port = server.grpc_port if protocol == "grpc" else server.port
    # Warm-up: connections, first-call allocations and ONNX Runtime's first runs.
    warm_csv = workdir / "warmup.csv"
    warm = drive(binary, port, concurrency, WARMUP_REQUESTS, warm_csv, protocol, model)
    run_counted_retrying(warm, WARMUP_REQUESTS).check_returncode()
    command = drive(binary, port, concurrency, requests, csv_path, protocol, model)
    for attempt in range(1, _ATTEMPTS + 1):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = cpu_us(server.pid)
        switches_before = voluntary_switches(server.pid)
        try:
            done = _run_counted(command, requests)
        except subprocess.TimeoutExpired:
            _hung(attempt)
            if attempt == _ATTEMPTS:
                raise
            continue  # the counters are read again around the next try
        after = cpu_us(server.pid)
        switches_after = voluntary_switches(server.pid)
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        break
    row = single_run_row(done, csv_path)
    client = (
        children_after.ru_utime + children_after.ru_stime - children.ru_utime - children.ru_stime
    ) * 1e6
    return Point(
        server=name,
        concurrency=concurrency,
        requests=requests,
        server_us=(after - before) / requests,
        client_us=client / requests,
        avg_us=mean_latency_us(done.stdout),
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
        switches=(switches_after - switches_before) / requests,
    )


def render(points: Sequence[Point]) -> str:
    rows = [
        [
            p.server,
            str(p.concurrency),
            f"{p.requests:,}",
            f"{p.server_us:.0f}",
            f"{p.client_us:.0f}",
            f"{p.throughput:,.0f}",
            f"{p.p50_us:.0f}",
            f"{p.p99_us:.0f}",
            f"{p.switches:.1f}",
        ]
        for p in points
    ]
    header = [
        "server", "conc", "requests", "server CPU µs/req", "perf_analyzer CPU µs/req",
        "inf/s", "p50 µs", "p99 µs", "switches/req",
    ]  # fmt: skip
    return markdown_table(header, rows, [False] + [True] * 8)


def run_plan(
    parser: argparse.ArgumentParser, args: argparse.Namespace, known: Sequence[str]
) -> tuple[list[str], str, list[int]] | None:
    """The servers, perf_analyzer binary and concurrencies `--servers`, `--perf-analyzer` and
    `--concurrency` ask for; None (said on stderr) when there is no perf_analyzer."""
    servers = [s for s in args.servers.split(",") if s]
    unknown = sorted(set(servers) - set(known))
    if unknown:
        parser.error(f"unknown servers {unknown}; choose from {tuple(known)}")
    binary = find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        print("perf_analyzer not found (--perf-analyzer or $PERF_ANALYZER)", file=sys.stderr)
        return None
    return servers, binary, [int(c) for c in args.concurrency.split(",") if c]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma list of %(default)s")
    parser.add_argument("--concurrency", default="16", help="comma list (default %(default)s)")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--perf-analyzer", default=None, help="the perf_analyzer binary")
    parser.add_argument(
        "--agent-arg", action="append", default=[], help="extra `agent serve` argument (repeat)"
    )
    args = parser.parse_args(argv)
    plan = run_plan(parser, args, SERVERS)
    if plan is None:
        return 2
    servers, binary, concurrency = plan
    points: list[Point] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="cpu-per-request-") as tmp:
        root = Path(tmp)
        repos = write_mlp_repositories(root, *SERVERS[1:3])
        for name in servers:
            server = Server(server_command(name, repos, args.agent_arg))
            try:
                for c in concurrency:
                    point = run_point(binary, server, name, c, args.requests, root)
                    print(
                        f"{name} c={c}: {point.server_us:.0f} µs CPU/request, "
                        f"{point.throughput:,.0f} inf/s",
                        file=sys.stderr,
                    )
                    points.append(point)
            finally:
                server.stop()
    print(render(points))
    print(f"\nload average before/after: {load_before:.2f} / {load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
