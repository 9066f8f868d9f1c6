"""`python -m bench.dataplane_cost`: the agent's own CPU per inference, layer by layer, in-process.

The demo MLP (tiny: its batches run inline on the event loop) is called through each layer in
turn, N calls a round, alternating layers within each round: the runtime alone (`Backend.run`),
the scheduler (`ModelScheduler.submit`) and the data plane (`DataPlane.infer`: routing,
validation, statistics, the response). Each figure is the calling thread's CPU time per call
(`time.thread_time_ns`); the layer's own cost is its figure minus the one below it, so the table
compares every layer against its baseline in the same run. `--stub` answers every run with a
fixed output instead of ONNX Runtime, which leaves only the agent's own code to measure.

No sockets: the transports' cost is `bench.cpu_per_request`'s. To compare this tree with
another, run the file against each (`PYTHONPATH=TREE python bench/dataplane_cost.py --stub`, the
other tree's `agent` and `bench.report`), alternating: on a busy machine compare the minima.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np

from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.runtime.demo import mlp_model
from agent.serving.dataplane import DataPlane
from agent.tensors.request import InferInput, InferRequest
from agent.tensors.signature import ValidatedRequest
from bench.report import load_average, markdown_table

LAYERS = ("backend.run", "scheduler.submit", "dataplane.infer")
_WARMUP_CALLS = 200  # enough for the scheduler to measure the model and run it inline


async def measure(calls: int, rounds: int, *, stub: bool) -> dict[str, list[float]]:
    """µs of CPU per call for each layer, one figure per round."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        (root / "mlp" / "1").mkdir(parents=True)
        (root / "mlp" / "1" / "model.onnx").write_bytes(mlp_model().SerializeToString())
        registry = ModelRegistry(root, LoadSettings(intra_op_threads=1, measure_memory=False))
        try:
            if registry.load_all():
                raise RuntimeError("the demo MLP did not load")
            served, number = registry.resolve("mlp", None)
            loaded = served.versions[number]
            backend = loaded.backend
            assert backend is not None
            x = np.zeros((1, 64), np.float32)
            if stub:
                answer = [np.zeros((1, 10), np.float32)]
                backend.run = lambda feeds, names, **_: answer  # type: ignore[method-assign]
            plane = DataPlane(registry)
            request = InferRequest((InferInput("INPUT0", "FP32", x.shape, x),))
            valid = ValidatedRequest({"INPUT0": x}, ("OUTPUT0",), 1)

            async def run() -> object:
                return backend.run(valid.feeds, valid.output_names)

            calls_of: dict[str, Callable[[], Awaitable[object]]] = {
                "backend.run": run,
                "scheduler.submit": lambda: loaded.scheduler.submit(valid),
                "dataplane.infer": lambda: plane.infer("mlp", None, request),
            }
            for call in calls_of.values():
                for _ in range(_WARMUP_CALLS):
                    await call()
            figures: dict[str, list[float]] = {layer: [] for layer in LAYERS}
            for _ in range(rounds):
                for layer in LAYERS:
                    call = calls_of[layer]
                    start = time.thread_time_ns()
                    for _ in range(calls):
                        await call()
                    figures[layer].append((time.thread_time_ns() - start) / calls / 1000)
            return figures
        finally:
            registry.close()


def table(figures: dict[str, list[float]]) -> str:
    """One row per layer: min and median µs per call, and the layer's own share of each."""
    rows: list[Sequence[str]] = []
    below_min = below_median = 0.0
    for layer in LAYERS:
        low, mid = min(figures[layer]), statistics.median(figures[layer])
        rows.append(
            [
                layer,
                f"{low:.2f}",
                f"{mid:.2f}",
                f"{low - below_min:+.2f}",
                f"{mid - below_median:+.2f}",
            ]
        )
        below_min, below_median = low, mid
    headers = ["layer", "min µs/call", "median µs/call", "own (min)", "own (median)"]
    return markdown_table(headers, rows, [False, True, True, True, True])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dataplane_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=5000, help="calls per layer and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stub", action="store_true", help="a fixed answer instead of ORT")
    args = parser.parse_args(argv)
    before = load_average()
    figures = asyncio.run(measure(args.calls, args.rounds, stub=args.stub))
    print(table(figures))
    print(f"\nload average before/after: {before:.2f} / {load_average():.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
