"""`python -m bench`: raw ONNX Runtime vs. the agent without and with dynamic batching.

Steps, all in a temporary folder that is removed afterwards:
  1. generate the models (bench.models; nothing is downloaded);
  2. raw ONNX Runtime in this process at each batch size (the limit);
  3. for each model and each repository ("nobatch", "dynbatch"): start the agent as a child
     process, run perf_analyzer at each concurrency, sample the agent's RSS;
  4. print one table (and a memory table); --out also writes them as markdown;
  5. issue 18's targets as same-run ratios (bench.targets): gRPC / HTTP throughput, gRPC / HTTP
     p50 at c=1 as the median of alternating pairs against one agent (bench.latency_pairs), the
     agent's CPU per MLP request against the aiohttp floor (bench.cpu_per_request), and its CPU
     per CNN inference against raw ORT at the batch sizes the batcher formed
     (bench.cpu_per_inference).
`--shared-memory` adds a column: the dynamic-batching agent driven over HTTP with
`--shared-memory system` (tensors in POSIX shared memory, as local clients on a device send them).
`--soak SECONDS` instead runs the MLP at concurrency 16 for that long and tracks RSS.
Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from bench.cpu_per_inference import AgentCpu, measure_agent
from bench.models import (
    MAX_BATCH,
    MODELS,
    MODES,
    BenchModel,
    instances,
    write_model_files,
    write_repository,
)
from bench.perf import (
    WINDOWS,
    LoadResult,
    find_perf_analyzer,
    perf_analyzer_version,
    run_perf_analyzer,
)
from bench.procs import MB, AgentProcess, BenchError, RssSampler
from bench.raw import RawResult, make_session, measure_raw
from bench.report import (
    fmt_latencies,
    fmt_mb,
    fmt_percent,
    fmt_rate,
    load_average,
    machine_lines,
    markdown_table,
    usable_cores,
)
from bench.targets import (
    CNN_CPU_MODELS,
    MLP_CPU_SERVERS,
    Targets,
    cnn_cpu_points,
    render_targets,
    run_cnn_floor,
    run_latency_pairs,
    run_mlp_cpu,
)

DEFAULT_CONCURRENCY = (1, 4, 16, 32)
RAW_BATCHES = (1, 4, 8, 16, 32)
SPREAD_FLAG = 0.10  # perf_analyzer's default stability criterion
SOAK_CONCURRENCY = 16
SOAK_WINDOW_MS = 20_000  # perf_analyzer window during the soak
IDLE_SETTLE_S = 1.0
SETTLE_AFTER_LOAD_S = 10.0  # memory handed back after a burst shows by then
AGENT_START_S = 4.0  # rough start-up cost per agent, for the estimate


@dataclass(frozen=True, slots=True)
class Settings:
    models: tuple[BenchModel, ...]
    concurrency: tuple[int, ...]
    raw_batches: tuple[int, ...]
    interval_ms: int
    raw_seconds: float
    raw_min_calls: int
    threads: int
    perf_analyzer: str | None
    quick: bool
    shared_memory: bool = False
    mlp_cpu_requests: int = 10_000  # per server in the MLP CPU table
    raw_cpu_seconds: float = 1.5  # raw ORT time per batch size in the CNN CPU table
    cnn_floor_requests: int = 1500  # aiohttp floor with the CNN's requests
    latency_rounds: int = 9  # alternating HTTP/gRPC pairs at c=1 (MLP, dynbatch)
    latency_requests: int = 1500  # per run in those pairs


@dataclass(slots=True)
class AgentRun:
    """One agent (model x repository mode) under perf_analyzer."""

    results: dict[int, LoadResult | str] = field(default_factory=dict)  # str: the error
    idle_rss: int = 0
    peak_rss: int = 0
    after_rss: int = 0
    settled_rss: int = 0  # SETTLE_AFTER_LOAD_S after the load
    plan_bytes: int = 0  # the agent's memory plan for the model
    error: str = ""
    cpu: dict[int, AgentCpu] = field(default_factory=dict)  # the agent's CPU per point


def _over_plan(rss: int, run: AgentRun) -> str:
    """RSS above idle as a multiple of the memory plan's figure."""
    if not (rss and run.idle_rss and run.plan_bytes):
        return "n/a"
    return f"{(rss - run.idle_rss) / run.plan_bytes:.2f}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _model_list(text: str) -> tuple[BenchModel, ...]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {', '.join(unknown) or text!r}; choose from {', '.join(MODELS)}"
        )
    return tuple(MODELS[k] for k in dict.fromkeys(keys))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="short windows and budgets: a ~5 minute smoke run"
    )
    parser.add_argument(
        "--models",
        type=_model_list,
        default=tuple(MODELS.values()),
        help=f"comma-separated, from {','.join(MODELS)} (default: all)",
    )
    parser.add_argument(
        "--concurrency",
        type=_int_list,
        default=DEFAULT_CONCURRENCY,
        help="perf_analyzer concurrencies (default 1,4,16,32)",
    )
    parser.add_argument(
        "--measurement-interval",
        type=int,
        metavar="MS",
        help=f"perf_analyzer window; {WINDOWS} windows per point (default 8000, --quick 1200)",
    )
    parser.add_argument(
        "--raw-seconds",
        type=float,
        metavar="S",
        help="raw ONNX Runtime time per batch size (default 4, --quick 0.5)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=usable_cores(),
        help="ONNX Runtime intra-op threads, raw and agent (default: usable cores)",
    )
    parser.add_argument(
        "--perf-analyzer",
        metavar="PATH",
        help="default: $PERF_ANALYZER, .venv-perf/bin/perf_analyzer, or PATH",
    )
    parser.add_argument(
        "--shared-memory",
        action="store_true",
        help="also run the dynbatch agent over HTTP with perf_analyzer --shared-memory system",
    )
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the report here")
    parser.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help=f"only the soak test: MLP at concurrency {SOAK_CONCURRENCY} for SECONDS (>= 30), "
        "agent RSS sampled every 10 s",
    )
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    quick = bool(args.quick)
    concurrency: tuple[int, ...] = args.concurrency
    # The raw column at concurrency c is the batch of c rows (capped), so measure those too.
    batches = sorted({*RAW_BATCHES, *(min(c, MAX_BATCH) for c in concurrency)})
    return Settings(
        models=args.models,
        concurrency=concurrency,
        raw_batches=tuple(batches),
        interval_ms=args.measurement_interval or (1200 if quick else 8000),
        raw_seconds=args.raw_seconds if args.raw_seconds is not None else (0.5 if quick else 4.0),
        raw_min_calls=3 if quick else 10,
        threads=max(1, args.threads),
        perf_analyzer=find_perf_analyzer(args.perf_analyzer),
        quick=quick,
        shared_memory=bool(args.shared_memory),
        mlp_cpu_requests=1500 if quick else 10_000,
        raw_cpu_seconds=0.3 if quick else 1.5,
        cnn_floor_requests=300 if quick else 1500,
        latency_rounds=5 if quick else 9,
    )


def interval_for(model: BenchModel, s: Settings) -> int:
    """The perf_analyzer window for a model: the setting, but never below the model's floor."""
    return max(s.interval_ms, model.min_interval_ms)


def estimate_seconds(s: Settings) -> float:
    """Observed on 2 cores: a point takes about 1.2 x its windows plus 0.5 s."""
    raw = len(s.models) * len(s.raw_batches) * (1.1 * s.raw_seconds + 0.3)
    if s.perf_analyzer is None:
        return raw
    agent = 0.0
    for model in s.models:
        point = 1.2 * WINDOWS * interval_for(model, s) / 1000 + 0.5
        runs = len(MODES) + 1 + int(s.shared_memory)
        agent += runs * (len(s.concurrency) * point + AGENT_START_S)
        if model.key in CNN_CPU_MODELS:  # raw ORT at up to ~8 batch sizes, the floor server
            agent += 8 * (s.raw_cpu_seconds + 0.5) + s.cnn_floor_requests / 1000 + 3
        if model.key == "mlp":  # three servers at ~2,500 requests/s, plus start and warm-up
            agent += len(MLP_CPU_SERVERS) * (s.mlp_cpu_requests / 2500 + AGENT_START_S + 1)
            # Alternating pairs at c=1, ~1,000 requests/s, plus start and two warm-ups.
            agent += 2 * s.latency_rounds * (s.latency_requests / 1000 + 0.5) + AGENT_START_S + 1
    return raw + agent


# --- the suite --------------------------------------------------------------------------------


def run_raw(model: BenchModel, path: Path, s: Settings) -> dict[int, RawResult]:
    session = make_session(path, s.threads)
    results: dict[int, RawResult] = {}
    for batch in s.raw_batches:
        r = measure_raw(session, model, batch, s.raw_seconds, s.raw_min_calls)
        results[batch] = r
        log(
            f"[{model.key}] raw ORT batch {batch}: {fmt_rate(r.throughput)} inf/s, "
            f"p50/p95/p99 {fmt_latencies(r.p50_us, r.p95_us, r.p99_us)} µs ({r.calls} calls)"
        )
    return results


def _threads(model: BenchModel, mode: str, s: Settings) -> int:
    """Intra-op threads per instance: the cores shared between a repository's instances."""
    return max(1, s.threads // instances(model, mode))


def run_agent(
    model: BenchModel,
    mode: str,
    repo: Path,
    workdir: Path,
    s: Settings,
    protocol: str = "http",
    shared_memory: bool = False,
) -> AgentRun:
    assert s.perf_analyzer is not None
    run = AgentRun()
    tag = f"[{model.key}/{mode}/{protocol}{'+shm' if shared_memory else ''}]"
    threads = _threads(model, mode, s)
    try:
        with AgentProcess(repo, threads) as agent:
            log(f"{tag} agent pid {agent.pid} listening on {agent.url}")
            time.sleep(IDLE_SETTLE_S)
            run.idle_rss = agent.rss_bytes()
            run.plan_bytes = agent.memory_plan_bytes()
            with RssSampler(agent.pid) as sampler:
                for c in s.concurrency:
                    if not agent.alive():
                        run.results[c] = "the agent exited"
                        continue
                    point_start = time.monotonic()
                    load = functools.partial(
                        run_perf_analyzer,
                        s.perf_analyzer,
                        model.served_name,
                        agent.grpc_url if protocol == "grpc" else agent.url,
                        c,
                        interval_for(model, s),
                        workdir,
                        protocol,
                        shared_memory,
                    )
                    try:
                        # The agent's CPU and executions (statistics endpoint) around the run.
                        r, run.cpu[c] = measure_agent(
                            agent.pid, agent.url, model.served_name, instances(model, mode), load
                        )
                    except BenchError as exc:
                        agent_error = agent.last_error()
                        message = str(exc) + (f"\nagent log: {agent_error}" if agent_error else "")
                        run.results[c] = message
                        log(f"{tag} c={c}: FAILED: {message}")
                        continue
                    run.results[c] = r
                    log(
                        f"{tag} c={c}: {fmt_rate(r.throughput)} inf/s, p50/p95/p99 "
                        f"{fmt_latencies(r.p50_us, r.p95_us, r.p99_us)} µs, "
                        f"window spread {r.spread:.0%} ({time.monotonic() - point_start:.1f} s)"
                    )
            run.peak_rss = sampler.peak
            if agent.alive():
                run.after_rss = agent.rss_bytes()
                time.sleep(SETTLE_AFTER_LOAD_S)
                run.settled_rss = agent.rss_bytes()
            else:
                tail = "\n".join(agent.stderr_tail().splitlines()[-5:])
                run.error = f"the agent exited during the run:\n{tail}"
    except BenchError as exc:
        run.error = str(exc)
        log(f"{tag} FAILED: {exc}")
    return run


def run_suite(root: Path, s: Settings) -> str:
    load_at_start = load_average()
    log(f"generating {', '.join(m.key for m in s.models)} into {root}")
    paths = write_model_files(root, list(s.models))
    raw: dict[str, dict[int, RawResult]] = {}
    agents: dict[tuple[str, str], AgentRun] = {}
    extra = Targets()
    for model in s.models:
        raw[model.key] = run_raw(model, paths[model.key], s)
        if s.perf_analyzer is None:
            continue
        repos = {}
        for mode in MODES:
            repos[mode] = write_repository(root, model, mode, paths[model.key])
            agents[model.key, mode] = run_agent(model, mode, repos[mode], root, s)
        # The same dynamic-batching repository over gRPC, next to the HTTP run.
        repo = repos["dynbatch"]
        agents[model.key, "grpc"] = run_agent(model, "dynbatch", repo, root, s, "grpc")
        if s.shared_memory:
            agents[model.key, "shm"] = run_agent(model, "dynbatch", repo, root, s, "http", True)
        if model.key in CNN_CPU_MODELS:
            extra.cnn_cpu[model.key] = cnn_cpu_points(
                {"http": agents[model.key, "dynbatch"].cpu, "grpc": agents[model.key, "grpc"].cpu},
                paths[model.key],
                model,
                instances(model, "dynbatch"),
                _threads(model, "dynbatch", s),
                s.raw_cpu_seconds,
                s.raw_min_calls,
                log,
            )
            extra.cnn_floor[model.key] = run_cnn_floor(
                s.perf_analyzer, model, s.cnn_floor_requests, root, log
            )
        if model.key == "mlp":
            extra.mlp_cpu = run_mlp_cpu(
                s.perf_analyzer, repos["nobatch"], s.mlp_cpu_requests, root, log
            )
            extra.latency_pairs = run_latency_pairs(
                s.perf_analyzer, repos["dynbatch"], s.latency_rounds, s.latency_requests,
                _threads(model, "dynbatch", s), root, log,
            )  # fmt: skip
            extra.latency_pair_requests = s.latency_requests
    return render_suite(s, raw, agents, load_at_start, extra)


# --- rendering --------------------------------------------------------------------------------


def _load_cells(run: AgentRun | None, c: int) -> tuple[str, str]:
    if run is None:
        return "n/a", "n/a"
    result = run.results.get(c)
    if isinstance(result, LoadResult):
        flag = "*" if result.spread > SPREAD_FLAG else ""
        return (
            fmt_rate(result.throughput) + flag,
            fmt_latencies(result.p50_us, result.p95_us, result.p99_us),
        )
    return "failed", "failed"


def render_suite(
    s: Settings,
    raw: dict[str, dict[int, RawResult]],
    agents: dict[tuple[str, str], AgentRun],
    load_at_start: float,
    extra: Targets | None = None,
) -> str:
    pa = perf_analyzer_version(s.perf_analyzer) if s.perf_analyzer else "perf_analyzer missing"
    headers = [
        "model",
        "conc",
        "raw ORT inf/s",
        "raw p50/p95/p99 µs",
        "agent inf/s",
        "agent p50/p95/p99 µs",
        "agent+dynbatch inf/s",
        "dynbatch p50/p95/p99 µs",
        "dynbatch / raw best",
        "dynbatch gRPC inf/s",
        "gRPC p50/p95/p99 µs",
    ]
    if s.shared_memory:
        headers += ["dynbatch HTTP+shm inf/s", "shm p50/p95/p99 µs", "shm / raw best"]
    right = [False] + [True] * (len(headers) - 1)
    rows: list[list[str]] = []
    best_lines: list[str] = []
    for model in s.models:
        model_raw = raw[model.key]
        best = max(model_raw.values(), key=lambda r: r.throughput)
        best_lines.append(
            f"- raw ORT best batched throughput, {model.key}: {fmt_rate(best.throughput)} inf/s "
            f"at batch {best.batch}"
        )
        for c in s.concurrency:
            r = model_raw[min(c, MAX_BATCH)]
            nob = _load_cells(agents.get((model.key, "nobatch")), c)
            dyn_run = agents.get((model.key, "dynbatch"))
            dyn = _load_cells(dyn_run, c)
            dyn_result = dyn_run.results.get(c) if dyn_run else None
            ratio = (
                fmt_percent(dyn_result.throughput / best.throughput)
                if isinstance(dyn_result, LoadResult)
                else "n/a"
            )
            row = [
                model.key,
                str(c),
                fmt_rate(r.throughput),
                fmt_latencies(r.p50_us, r.p95_us, r.p99_us),
                *nob,
                *dyn,
                ratio,
                *_load_cells(agents.get((model.key, "grpc")), c),
            ]
            if s.shared_memory:
                shm_run = agents.get((model.key, "shm"))
                shm_result = shm_run.results.get(c) if shm_run else None
                row += [
                    *_load_cells(shm_run, c),
                    fmt_percent(shm_result.throughput / best.throughput)
                    if isinstance(shm_result, LoadResult)
                    else "n/a",
                ]
            rows.append(row)
    title = "## edge-agent benchmark" + (" (--quick)" if s.quick else "")
    parts = [
        title,
        "",
        *machine_lines(pa, load_at_start),
        "",
        markdown_table(headers, rows, right),
        "",
    ]
    notes = [
        *best_lines,
        f"- raw ORT: ONNX Runtime in-process, CPU, intra_op_num_threads={s.threads}, sequential; "
        "at concurrency c the batch is min(c, 32) rows per session.run, latency is per call, "
        f"{s.raw_seconds:g} s per batch size.",
        "- agent: `python -m agent serve` child process; perf_analyzer over HTTP with binary "
        f"tensors, batch 1 per request, c requests in flight, {WINDOWS} windows of "
        f"{s.interval_ms} ms merged"
        + "".join(
            f" ({m.key}: {interval_for(m, s)} ms)"
            for m in s.models
            if interval_for(m, s) != s.interval_ms
        )
        + "; perf_analyzer runs on the same cores. "
        f"`*`: throughput varied more than {SPREAD_FLAG:.0%} between windows.",
        "- repositories: max_batch_size 32; nobatch: one CPU instance; dynbatch: "
        + "; ".join(
            f"{m.key}: preferred_batch_size {list(m.preferred_batch_sizes)}, "
            f"max_queue_delay_microseconds {m.max_queue_delay_us}, "
            f"{m.dynbatch_instances} instance(s) x {max(1, s.threads // m.dynbatch_instances)} "
            "intra-op thread(s)"
            for m in s.models
        )
        + ".",
    ]
    if s.shared_memory:
        notes.append(
            "- HTTP+shm: the dynbatch repository with perf_analyzer `--shared-memory system`: "
            "each request names its input and output regions instead of carrying tensor bytes; "
            "the agent copies inputs out of shared memory once and writes outputs into it."
        )
    if s.perf_analyzer is None:
        notes.append(
            "- perf_analyzer was not found (make perf-analyzer; or set PERF_ANALYZER): "
            "agent columns skipped."
        )
    parts += [*notes, ""]
    if agents:
        mem_rows = []
        for (key, mode), run in agents.items():
            mem_rows.append(
                [
                    key,
                    mode,
                    fmt_mb(run.idle_rss) if run.idle_rss else "n/a",
                    fmt_mb(run.peak_rss) if run.peak_rss else "n/a",
                    fmt_mb(run.after_rss) if run.after_rss else "n/a",
                    fmt_mb(run.settled_rss) if run.settled_rss else "n/a",
                    fmt_mb(run.plan_bytes) if run.plan_bytes else "n/a",
                    _over_plan(run.peak_rss, run),
                    _over_plan(run.settled_rss, run),
                ]
            )
        parts += [
            "Agent memory (RSS, MB): idle after loading, peak under load (sampled every 0.1 s), "
            f"right after the load and {SETTLE_AFTER_LOAD_S:.0f} s later; the memory plan's "
            "figure for the model (edge_agent_memory_models_bytes), and RSS above idle as a "
            "multiple of it (targets: peak <= 1.1, 10 s after <= 0.5).",
            "",
            markdown_table(
                [
                    "model",
                    "repository",
                    "idle",
                    "peak under load",
                    "after load",
                    f"{SETTLE_AFTER_LOAD_S:.0f} s after",
                    "plan",
                    "peak-idle / plan (target <= 1.1)",
                    f"{SETTLE_AFTER_LOAD_S:.0f} s after-idle / plan (target <= 0.5)",
                ],
                mem_rows,
                [False, False] + [True] * 7,
            ),
            "",
        ]
        parts += render_targets(
            s.models,
            s.concurrency,
            {key: run.results for (key, mode), run in agents.items() if mode == "dynbatch"},
            {key: run.results for (key, mode), run in agents.items() if mode == "grpc"},
            extra or Targets(),
            s.mlp_cpu_requests,
            lambda model: _threads(model, "dynbatch", s),
        )
        errors = [
            f"- {key}/{mode}: {run.error or ''}".rstrip()
            + "".join(f"\n  c={c}: {err}" for c, err in run.results.items() if isinstance(err, str))
            for (key, mode), run in agents.items()
            if run.error or any(isinstance(v, str) for v in run.results.values())
        ]
        if errors:
            parts += ["Errors:", "", *errors, ""]
    return "\n".join(parts)


# --- soak ---------------------------------------------------------------------------------------


def run_soak(root: Path, s: Settings, seconds: float) -> str:
    if s.perf_analyzer is None:
        raise BenchError(
            "the soak test needs perf_analyzer (make perf-analyzer; or set PERF_ANALYZER)"
        )
    load_at_start = load_average()
    model = MODELS["mlp"]
    mode = "dynbatch"
    paths = write_model_files(root, [model])
    repo = write_repository(root, model, mode, paths[model.key])
    # Back-to-back perf_analyzer runs of 3 x 20 s: one run with windows of seconds / 3 holds
    # millions of requests per window at several thousand inf/s and overruns its timeout.
    interval_ms = min(SOAK_WINDOW_MS, max(1000, int(seconds * 1000 / WINDOWS)))

    def progress(elapsed: float, rss: int) -> None:
        log(f"[soak] t={elapsed:4.0f} s  RSS {rss / MB:.1f} MB")

    with AgentProcess(repo, s.threads) as agent:
        log(
            f"[soak] agent pid {agent.pid} on {agent.url}; {model.key}/{mode}, "
            f"concurrency {SOAK_CONCURRENCY}, {seconds:g} s"
        )
        time.sleep(IDLE_SETTLE_S)
        idle = agent.rss_bytes()
        with RssSampler(
            agent.pid, interval_s=1.0, series_every_s=10.0, on_record=progress
        ) as sampler:
            runs: list[LoadResult] = []
            began = time.monotonic()
            while not runs or time.monotonic() - began < seconds:
                runs.append(
                    run_perf_analyzer(
                        s.perf_analyzer,
                        model.served_name,
                        agent.url,
                        SOAK_CONCURRENCY,
                        interval_ms,
                        root,
                    )
                )
        if not agent.alive():
            raise BenchError("the agent exited during the soak:\n" + agent.stderr_tail())
    series = sampler.samples
    under_load = [rss for t, rss in series if t >= 5.0] or [rss for _, rss in series]
    start, end = under_load[0], under_load[-1]
    pa = perf_analyzer_version(s.perf_analyzer)
    table = markdown_table(
        ["", "RSS MB"],
        [
            ["idle after loading", fmt_mb(idle)],
            ["start of load (first 10 s sample)", fmt_mb(start)],
            ["end of load", fmt_mb(end)],
            ["max (sampled every 1 s)", fmt_mb(sampler.peak)],
            ["end - start", f"{(end - start) / MB:+.1f}"],
        ],
        [False, True],
    )
    rates = [r.throughput for r in runs]
    thirds = [rates[i * len(rates) // 3 : (i + 1) * len(rates) // 3] or rates for i in range(3)]
    windows = ", ".join(fmt_rate(sum(t) / len(t)) for t in thirds)
    worst = max(runs, key=lambda r: r.p99_us)
    return "\n".join(
        [
            f"## edge-agent soak: {model.key}/{mode} at concurrency {SOAK_CONCURRENCY}, "
            f"{seconds:g} s",
            "",
            *machine_lines(pa, load_at_start),
            f"- load: {fmt_rate(sum(rates) / len(rates))} inf/s over {len(runs)} perf_analyzer "
            f"runs of 3 x {interval_ms / 1000:g} s (per third of the runs: {windows}); worst "
            f"run p50/p95/p99 {fmt_latencies(worst.p50_us, worst.p95_us, worst.p99_us)} µs",
            "",
            table,
            "",
            "RSS every 10 s (MB): " + ", ".join(f"{t:.0f}s {rss / MB:.1f}" for t, rss in series),
            "",
        ]
    )


# --- entry point --------------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops its child and removes its files."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.soak is not None and args.soak < 30:
        parser.error("--soak needs at least 30 seconds")
    s = settings_from(args)
    if s.perf_analyzer is None:
        log("perf_analyzer not found (make perf-analyzer, or set PERF_ANALYZER): raw ORT only")
    expected = 1.25 * args.soak + 10 if args.soak is not None else estimate_seconds(s)
    log(f"expected run time: about {expected / 60:.1f} min")
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="edge-agent-bench-") as tmp:
            root = Path(tmp)
            report = run_soak(root, s, args.soak) if args.soak is not None else run_suite(root, s)
    except KeyboardInterrupt:
        log("interrupted: child processes stopped, temporary files removed")
        return 130
    except BenchError as exc:
        log(f"bench: error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    log(f"done in {(time.monotonic() - started) / 60:.1f} min")
    print(report, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")
        log(f"wrote {args.out}")
    return 0
