"""`python -m bench.cpu_per_inference`: the agent's CPU per CNN inference vs in-process ORT.

Issue 18's target: with dynamic batching, the agent spends at most 1.05x the CPU that ONNX Runtime
alone spends per inference at the batch sizes the batcher forms. Both sides are set up alike:
the agent's intra-op threads per instance, one inter-op thread, intra-op spinning off (as
agent/backends/onnx.py sets it), CPU execution provider.

Agent side: the server's utime+stime (/proc/PID/stat) and its statistics endpoint
(`/v2/models/<m>/stats`: inference_count, execution_count and per batch size the executions)
are read before and after a perf_analyzer run; CPU per inference = CPU delta / inference delta,
and the executions per batch size in that delta are the batch mix the batcher formed.
Raw side: `session.run` on random input at each batch size of that mix, this process's CPU time
(time.process_time_ns: every thread) per call; weighted by the mix, per inference.

The standalone command alternates the two (agent point, then raw at its mix) for --rounds rounds
and prints every round: on a shared machine the spread between rounds is part of the figure.
`python -m bench` reuses these functions for its CNN CPU table.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.cpu_per_request import TICK_US, cpu_us, drive
from bench.models import MODELS, BenchModel, instances, write_model_files, write_repository
from bench.perf import find_perf_analyzer, single_run_row
from bench.procs import REPO_ROOT, AgentProcess, BenchError
from bench.raw import make_session
from bench.report import load_average, markdown_table, usable_cores

T = TypeVar("T")

CNN_TARGET = 1.05  # issue 18: agent CPU per inference <= 1.05x raw ORT's
RAW_COVERAGE = 0.98  # batch sizes holding this share of the inferences are measured, the rest
# take the nearest measured size's figure (rare sizes from a queue delay running out)
_WARMUP_REQUESTS = 64
FRESH_INPUTS = 4  # distinct input batches each raw thread cycles through


@dataclass(frozen=True, slots=True)
class Counters:
    """A model's execution counters from the agent's statistics endpoint (all versions)."""

    inferences: int = 0
    executions: int = 0
    batches: Mapping[int, int] = field(default_factory=dict)  # batch size -> executions

    def minus(self, before: Counters) -> Counters:
        """What happened between `before` and this reading."""
        sizes = {
            size: count - before.batches.get(size, 0)
            for size, count in self.batches.items()
            if count > before.batches.get(size, 0)
        }
        return Counters(
            self.inferences - before.inferences, self.executions - before.executions, sizes
        )

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


def parse_counters(stats: Mapping[str, Any]) -> Counters:
    """Counters from a KServe statistics body (`{"model_stats": [...]}`), summed over versions."""
    inferences = executions = 0
    batches: dict[int, int] = {}
    for entry in stats.get("model_stats", []):
        inferences += int(entry.get("inference_count", 0))
        executions += int(entry.get("execution_count", 0))
        for row in entry.get("batch_stats", []):
            size = int(row["batch_size"])
            batches[size] = batches.get(size, 0) + int(row["compute_infer"]["count"])
    return Counters(inferences, executions, batches)


def read_counters(http_url: str, model: str) -> Counters:
    """GET `/v2/models/<model>/stats` from the agent at `http_url` ("host:port")."""
    url = f"http://{http_url}/v2/models/{urllib.parse.quote(model)}/stats"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {url}: {exc}") from None
    return parse_counters(body)


def thread_cpu_us(pid: int) -> dict[int, float]:
    """utime + stime of each live thread of a process, in microseconds, by thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text(encoding="ascii")
        except OSError:  # the thread ended meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) * TICK_US
    return out


@dataclass(frozen=True, slots=True)
class AgentCpu:
    """The agent's CPU and executions over one load run.

    `busiest_us`: the CPU of its `instances` busiest threads, which under a compute-bound load
    are the model's execution threads (session.run plus batch assembly and splitting); the
    rest is the event loop and the transport's threads.
    """

    cpu_us: float
    busiest_us: float
    counters: Counters

    def per_inference(self, us: float) -> float:
        return us / self.counters.inferences if self.counters.inferences else 0.0

    @property
    def us_per_inference(self) -> float:
        return self.per_inference(self.cpu_us)


def measure_agent(
    pid: int, http_url: str, model: str, instances: int, load: Callable[[], T]
) -> tuple[T, AgentCpu]:
    """Run `load()` and return its result with the agent's CPU and counters over it."""
    counters = read_counters(http_url, model)
    threads = thread_cpu_us(pid)
    before = cpu_us(pid)
    result = load()
    after = cpu_us(pid)
    deltas = sorted(
        (us - threads.get(tid, 0.0) for tid, us in thread_cpu_us(pid).items()), reverse=True
    )
    return result, AgentCpu(
        after - before,
        sum(deltas[: max(1, instances)]),
        read_counters(http_url, model).minus(counters),
    )


def raw_sessions(path: Path, instances: int, intra_op_threads: int) -> list[Any]:
    """ONNX Runtime sessions set up as the agent's instances (spinning off), one per instance."""
    return [
        make_session(path, intra_op_threads, allow_spinning=False) for _ in range(max(1, instances))
    ]


def raw_cpu_per_call_us(
    sessions: Sequence[Any], model: BenchModel, batch: int, budget_s: float, min_calls: int
) -> float:
    """This process's CPU µs per `session.run` of `batch` rows, the sessions running side by side.

    One thread per session, as the agent runs one execution per instance at a time. Each thread
    cycles through FRESH_INPUTS random batches: the agent never sees the same input twice, so a
    batch kept warm in the cache would flatter the raw side.
    """
    name = sessions[0].get_inputs()[0].name
    rng = np.random.default_rng(batch)
    inputs = [[model.sample(batch, rng) for _ in range(FRESH_INPUTS)] for _ in sessions]
    calls = [0] * len(sessions)
    start = threading.Barrier(len(sessions) + 1)
    deadline = [0.0]

    def loop(i: int) -> None:
        session, feeds = sessions[i], inputs[i]
        session.run(None, {name: feeds[0]})  # warm-up, outside the measurement
        start.wait()
        n = 0
        while n < min_calls or time.perf_counter() < deadline[0]:
            session.run(None, {name: feeds[n % FRESH_INPUTS]})
            n += 1
        calls[i] = n

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(sessions))]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + budget_s + 3600  # until every warm-up is done
    cpu_start = 0
    try:
        start.wait()
        cpu_start = time.process_time_ns()
        deadline[0] = time.perf_counter() + budget_s
    finally:
        for thread in threads:
            thread.join()
    return (time.process_time_ns() - cpu_start) / 1000 / sum(calls)


def raw_cpu_per_inference_us(
    mix: Mapping[int, int],
    per_call: Callable[[int], float],
    coverage: float = RAW_COVERAGE,
) -> float:
    """Raw CPU per inference over a batch mix (batch size -> executions).

    `per_call(batch)` measures one size (the caller caches it); the sizes holding `coverage` of
    the inferences are measured, the others count at the nearest measured size's per-row cost.
    """
    if not mix:
        raise ValueError("empty batch mix")
    rows = {size: size * count for size, count in mix.items()}
    total_rows = sum(rows.values())
    measured: dict[int, float] = {}
    covered = 0
    for size in sorted(rows, key=lambda s: (-rows[s], s)):
        if measured and covered >= coverage * total_rows:
            break
        measured[size] = per_call(size) / size  # per row
        covered += rows[size]
    cpu = 0.0
    for size, count in rows.items():
        nearest = min(measured, key=lambda m: (abs(m - size), m))
        cpu += count * measured[nearest]
    return cpu / total_rows


@dataclass(frozen=True, slots=True)
class CpuPoint:
    """Agent vs raw CPU per inference at one concurrency."""

    protocol: str
    concurrency: int
    agent: AgentCpu
    raw_us: float

    @property
    def ratio(self) -> float:
        return self.agent.us_per_inference / self.raw_us if self.raw_us else 0.0


def fmt_target(ratio: float, op: str, target: float) -> str:
    """`<= 1.05 (met)` / `(missed)`."""
    met = ratio <= target if op == "<=" else ratio >= target
    return f"{op} {target:.2f} ({'met' if met else 'missed'})"


def render(points: Sequence[CpuPoint], labels: Sequence[str] = ()) -> str:
    """The CNN CPU table: one row per point, each with the 1.05 target; `labels` adds a first
    column (which run each point comes from)."""
    rows = [
        [
            *([labels[i]] if labels else []),
            p.protocol,
            str(p.concurrency),
            f"{p.agent.counters.inferences:,}",
            f"{p.agent.counters.mean_batch:.2f}",
            f"{p.agent.us_per_inference:,.0f}",
            f"{p.agent.per_inference(p.agent.busiest_us):,.0f}",
            f"{p.agent.per_inference(p.agent.cpu_us - p.agent.busiest_us):,.0f}",
            f"{p.raw_us:,.0f}",
            f"{p.ratio:.3f}",
            fmt_target(p.ratio, "<=", CNN_TARGET),
        ]
        for i, p in enumerate(points)
    ]
    headers = [
        *(["run"] if labels else []),
        "protocol",
        "conc",
        "inferences",
        "mean batch",
        "agent CPU µs/inf",
        "of which execution threads",
        "other threads",
        "raw ORT CPU µs/inf",
        "agent / raw",
        "target",
    ]
    return markdown_table(headers, rows, [False] * (2 if labels else 1) + [True] * 9)


def notes(threads: int, instances: int) -> str:
    """What the CNN CPU table's columns mean."""
    return (
        "- agent CPU: the agent process's utime+stime over a perf_analyzer run (dynbatch "
        "repository) / the inferences its statistics counted in it; mean batch: inferences / "
        "executions. Execution threads: its busiest threads, one per instance (session.run, "
        "batch assembly, output split); other threads: the event loop (requests in and out) "
        "and the transport's.\n"
        f"- raw ORT: {instances} session(s) x {threads} intra-op thread(s) running side by side "
        "in this process, as the agent's instances do, intra-op spinning off on both sides; "
        "CPU per inference at each batch size the batcher formed, weighted by how many "
        f"inferences ran at that size; each thread cycles through {FRESH_INPUTS} random input "
        "batches (the agent never sees the same input twice)."
    )


class RawCache:
    """Raw CPU per call by batch size, measured once per set of sessions."""

    def __init__(
        self, sessions: Sequence[Any], model: BenchModel, budget_s: float, min_calls: int
    ) -> None:
        self._sessions = sessions
        self._model = model
        self._budget_s = budget_s
        self._min_calls = min_calls
        self.per_call: dict[int, float] = {}

    def __call__(self, batch: int) -> float:
        if batch not in self.per_call:
            self.per_call[batch] = raw_cpu_per_call_us(
                self._sessions, self._model, batch, self._budget_s, self._min_calls
            )
        return self.per_call[batch]


def drive_requests(
    binary: str,
    agent: AgentProcess,
    model: BenchModel,
    concurrency: int,
    requests: int,
    workdir: Path,
    protocol: str,
) -> None:
    """perf_analyzer sending `requests` requests at `concurrency` (raises BenchError on failure)."""
    url = agent.grpc_url if protocol == "grpc" else agent.url
    port = int(url.rsplit(":", 1)[1])
    csv_path = workdir / f"cpi-{protocol}-c{concurrency}.csv"
    csv_path.unlink(missing_ok=True)
    command = drive(binary, port, concurrency, requests, csv_path, protocol, model.served_name)
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=900, cwd=REPO_ROOT
    )
    single_run_row(done, csv_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="16,32", help="comma list (default %(default)s)")
    parser.add_argument("--protocols", default="http", help="comma list of http,grpc")
    parser.add_argument("--requests", type=int, default=600, help="per point (default 600)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=usable_cores(), help="cores to share")
    parser.add_argument("--raw-seconds", type=float, default=1.5, help="per batch size")
    parser.add_argument("--perf-analyzer", default=None)
    args = parser.parse_args(argv)
    binary = find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        print("perf_analyzer not found (--perf-analyzer or $PERF_ANALYZER)", file=sys.stderr)
        return 2
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    protocols = [p for p in args.protocols.split(",") if p]
    model = MODELS["cnn"]
    threads = max(1, args.threads // instances(model, "dynbatch"))
    points: list[tuple[str, CpuPoint]] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="cpu-per-inference-") as tmp:
        root = Path(tmp)
        onnx_path = write_model_files(root, [model])[model.key]
        repo = write_repository(root, model, "dynbatch", onnx_path)
        for round_no in range(1, args.rounds + 1):
            # A fresh session per round: the raw figure is re-measured next to each agent run.
            sessions = raw_sessions(onnx_path, instances(model, "dynbatch"), threads)
            raw = RawCache(sessions, model, args.raw_seconds, 3)
            with AgentProcess(repo, threads) as agent:
                for protocol in protocols:
                    for c in concurrency:
                        drive_requests(binary, agent, model, c, _WARMUP_REQUESTS, root, protocol)
                        load = functools.partial(
                            drive_requests, binary, agent, model, c, args.requests, root, protocol
                        )
                        _, cpu = measure_agent(
                            agent.pid,
                            agent.url,
                            model.served_name,
                            instances(model, "dynbatch"),
                            load,
                        )
                        point = CpuPoint(
                            protocol,
                            c,
                            cpu,
                            raw_cpu_per_inference_us(cpu.counters.batches, raw),
                        )
                        points.append((f"round {round_no}", point))
                        print(
                            f"round {round_no} {protocol} c={c}: agent "
                            f"{cpu.us_per_inference:,.0f} µs/inf (mean batch "
                            f"{cpu.counters.mean_batch:.2f}), raw {point.raw_us:,.0f}, "
                            f"ratio {point.ratio:.3f}",
                            file=sys.stderr,
                            flush=True,
                        )
    print(render([p for _, p in points], [label for label, _ in points]))
    print(
        f"\nintra-op threads {threads} per instance x {instances(model, 'dynbatch')} instances; "
        f"load average before/after: {load_before:.2f} / {load_average():.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
