"""Run Triton's perf_analyzer against the agent and read its results.

Each load point is one perf_analyzer run at one concurrency: HTTP, binary tensors both ways
(or, with `shared_memory`, tensors in system shared memory: requests only name the regions),
batch 1 per request, exactly three time windows of `--measurement-interval` merged into one
result. perf_analyzer's own stability rule (the last three windows within 10 %) is switched off
with a very wide `--stability-percentage`, because on a 2-core host that also runs the load
generator it often never settles, and then perf_analyzer exits with code 2 and writes nothing;
this also bounds the run time (WINDOWS x interval plus start-up).
Instead the window-to-window throughput spread is parsed from the verbose output and reported.
The numbers come from the `-f` CSV: "Concurrency,Inferences/Second,Client Send,Client Recv,
p50 latency,p90 latency,p95 latency,p99 latency" (latencies in microseconds).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.procs import REPO_ROOT, BenchError, stop_process

WINDOWS = 3
STABILITY_OFF = (
    "100000"  # max/min up to 1000x still counts as stable: always exactly WINDOWS windows
)
_PASS = re.compile(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec")
_AVG_LATENCY = re.compile(r"Avg latency: (\d+) usec")
STARTUP_ALLOWANCE_S = 90.0  # perf_analyzer start, config fetch, warm-up, draining the last requests


@dataclass(frozen=True, slots=True)
class LoadResult:
    """perf_analyzer's result at one concurrency."""

    concurrency: int
    throughput: float  # inferences (rows) per second
    p50_us: float
    p95_us: float
    p99_us: float
    window_throughputs: tuple[float, ...]

    @property
    def spread(self) -> float:
        """max/min - 1 over the measurement windows' throughputs (0.1 is perf_analyzer's 10 %)."""
        values = [v for v in self.window_throughputs if v > 0]
        if len(values) < 2:
            return 0.0
        return max(values) / min(values) - 1.0


def find_perf_analyzer(explicit: str | None) -> str | None:
    """--perf-analyzer, else $PERF_ANALYZER, else .venv-perf/bin/perf_analyzer, else PATH."""
    candidates = [explicit, os.environ.get("PERF_ANALYZER")]
    candidates.append(str(REPO_ROOT / ".venv-perf" / "bin" / "perf_analyzer"))
    candidates.append(shutil.which("perf_analyzer"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def perf_analyzer_version(binary: str) -> str:
    try:
        result = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (result.stdout + result.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def perf_analyzer_command(
    binary: str,
    model: str,
    url: str,
    concurrency: int,
    interval_ms: int,
    csv_path: Path,
    protocol: str = "http",
    shared_memory: bool = False,
) -> list[str]:
    # HTTP with Triton's binary tensor extension; gRPC always carries raw tensor bytes.
    formats = (
        ["--input-tensor-format", "binary", "--output-tensor-format", "binary"]
        if protocol == "http"
        else []
    )
    if shared_memory:
        # perf_analyzer registers one region per input and output (outputs up to 100 KB each).
        formats = ["--shared-memory", "system"]
    return [
        binary,
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        *formats,
        "--concurrency-range",
        str(concurrency),
        "--measurement-interval",
        str(interval_ms),
        "-b",
        "1",
        "--percentile=95",
        "--stability-percentage",
        STABILITY_OFF,
        "--max-trials",
        str(WINDOWS),
        "-v",
        "-f",
        str(csv_path),
    ]


def run_perf_analyzer(
    binary: str,
    model: str,
    url: str,
    concurrency: int,
    interval_ms: int,
    workdir: Path,
    protocol: str = "http",
    shared_memory: bool = False,
) -> LoadResult:
    """One perf_analyzer run; raises BenchError with its output's tail when it fails."""
    kind = protocol + ("-shm" if shared_memory else "")
    csv_path = workdir / f"perf-{model}-{kind}-c{concurrency}-{os.getpid()}.csv"
    csv_path.unlink(missing_ok=True)
    command = perf_analyzer_command(
        binary, model, url, concurrency, interval_ms, csv_path, protocol, shared_memory
    )
    # A window takes about 1.25 x its interval in practice; 1.5 x leaves room on a loaded host.
    timeout_s = 1.5 * WINDOWS * interval_ms / 1000 + STARTUP_ALLOWANCE_S
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace_s=5)
        raise BenchError(
            f"perf_analyzer (concurrency {concurrency}) did not finish in {timeout_s:.0f} s"
        ) from None
    finally:
        # Ctrl-C or any other exception while waiting: end the child by its pid.
        stop_process(proc, grace_s=5)
    if proc.returncode != 0 or not csv_path.is_file():
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise BenchError(
            f"perf_analyzer (concurrency {concurrency}) exited with code {proc.returncode}:\n{tail}"
        )
    return parse_results(csv_path, concurrency, output)


def parse_results(csv_path: Path, concurrency: int, output: str) -> LoadResult:
    """The CSV row for `concurrency`, plus the per-window throughputs from the verbose output."""
    with csv_path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    row = next((r for r in rows if r.get("Concurrency", "").strip() == str(concurrency)), None)
    if row is None:
        raise BenchError(f"no row for concurrency {concurrency} in {csv_path.name}: {rows!r}")
    try:
        return LoadResult(
            concurrency=concurrency,
            throughput=float(row["Inferences/Second"]),
            p50_us=float(row["p50 latency"]),
            p95_us=float(row["p95 latency"]),
            p99_us=float(row["p99 latency"]),
            window_throughputs=tuple(float(v) for v in _PASS.findall(output)),
        )
    except (KeyError, ValueError) as exc:
        raise BenchError(
            f"unexpected perf_analyzer CSV {csv_path.name}: {exc!r} in {row!r}"
        ) from None


def single_run_row(done: subprocess.CompletedProcess[str], csv_path: Path) -> dict[str, str]:
    """The CSV row of a one-concurrency perf_analyzer run (`done`), or its failure as BenchError."""
    if done.returncode != 0 or not csv_path.is_file():
        raise BenchError(
            f"perf_analyzer failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}"
        )
    with csv_path.open(newline="", encoding="utf-8") as handle:
        return next(csv.DictReader(handle))


def mean_latency_us(output: str) -> float:
    """The mean latency perf_analyzer prints ("Avg latency: N usec")."""
    match = _AVG_LATENCY.search(output)
    if match is None:
        raise BenchError(f"no 'Avg latency' in perf_analyzer's output:\n{output[-2000:]}")
    return float(match.group(1))
