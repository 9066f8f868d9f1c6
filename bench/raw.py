"""The limit: ONNX Runtime in this process, no server, one `session.run` per batch.

The session is set up like the agent's (intra-op threads = cores, one inter-op thread,
sequential execution, all graph optimizations), so the gap to the agent is serving overhead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.models import BenchModel

WARMUP_CALLS = 3


@dataclass(frozen=True, slots=True)
class RawResult:
    """Throughput and per-call latency of `session.run` at one batch size."""

    batch: int
    calls: int
    seconds: float
    throughput: float  # rows per second
    p50_us: float
    p95_us: float
    p99_us: float


def make_session(path: Path, intra_op_threads: int, *, allow_spinning: bool = True) -> Any:
    """`allow_spinning=False`: idle intra-op threads sleep, as in the agent's sessions."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure_raw(
    session: Any,
    model: BenchModel,
    batch: int,
    budget_s: float,
    min_calls: int,
    seed: int = 0,
) -> RawResult:
    """Call `session.run` on one random batch until `budget_s` and `min_calls` are both reached.

    A model too slow for `min_calls` within four budgets stops there (at least 3 calls).
    """
    feeds = {session.get_inputs()[0].name: model.sample(batch, np.random.default_rng(seed))}
    # Warm up: at least WARMUP_CALLS calls and a tenth of the budget (thread pool, caches, clocks).
    warm_until = time.perf_counter() + budget_s / 10
    calls = 0
    while calls < WARMUP_CALLS or time.perf_counter() < warm_until:
        session.run(None, feeds)
        calls += 1
    latencies_ns: list[int] = []
    hard_stop_ns = int(4 * budget_s * 1e9)
    budget_ns = int(budget_s * 1e9)
    start = time.perf_counter_ns()
    elapsed = 0
    while True:
        t0 = time.perf_counter_ns()
        session.run(None, feeds)
        t1 = time.perf_counter_ns()
        latencies_ns.append(t1 - t0)
        elapsed = t1 - start
        calls = len(latencies_ns)
        if elapsed >= budget_ns and calls >= min_calls:
            break
        if elapsed >= hard_stop_ns and calls >= 3:
            break
    lat_us = np.asarray(latencies_ns, dtype=np.float64) / 1000.0
    p50, p95, p99 = np.percentile(lat_us, [50, 95, 99])
    seconds = elapsed / 1e9
    return RawResult(
        batch=batch,
        calls=len(latencies_ns),
        seconds=seconds,
        throughput=batch * len(latencies_ns) / seconds,
        p50_us=float(p50),
        p95_us=float(p95),
        p99_us=float(p99),
    )
