"""FP32 vs INT8 (QDQ) latency and throughput on the CPU with ONNX Runtime, same model.

    python -m bench.int8_bench [--model MODEL.onnx --calibration DIR] [--batch 1 --batch 32]
                               [--seconds 2] [--threads 1]

Without --model it trains the test suite's digits MLP (scikit-learn's bundled data) and
quantizes it with `edge-agent quantize` (minmax; --target cpu by default, tensorrt for symmetric
INT8), then times both sessions on the same inputs: p50/p99 latency per batch and samples/s.
Time is measured with time.perf_counter over a fixed time budget per cell; no sleeps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from agent.quantize.command import main as quantize


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _time(session: ort.InferenceSession, x: np.ndarray, seconds: float) -> dict[str, float]:
    name = session.get_inputs()[0].name
    for _ in range(10):
        session.run(None, {name: x})
    laps = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        session.run(None, {name: x})
        laps.append(time.perf_counter() - start)
    arr = np.array(laps)
    return {
        "p50_ms": float(np.percentile(arr, 50) * 1e3),
        "p99_ms": float(np.percentile(arr, 99) * 1e3),
        "samples_s": x.shape[0] * len(arr) / float(arr.sum()),
    }


def _digits_model(work: Path) -> tuple[Path, Path, np.ndarray]:
    # sklearn (dev dependency) is only needed for the default model.
    from tests.agent.quantize.digits import train_digits, write_calibration  # noqa: PLC0415

    digits = train_digits()
    onnx.save(digits.model, str(work / "fp32.onnx"))
    write_calibration(work / "calib", digits.x_train)
    return work / "fp32.onnx", work / "calib", digits.x_test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_bench")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--calibration", type=Path)
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", choices=["tensorrt", "cpu"], default="cpu")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model is None:
            model, calib, pool = _digits_model(work)
        else:
            model, calib = args.model, args.calibration
            pool = np.concatenate([np.load(p) for p in sorted(calib.glob("*.npy"))])
        int8 = work / "int8.onnx"
        rc = quantize(
            [
                "quantize",
                str(model),
                "--calibration",
                str(calib),
                "--output",
                str(int8),
                "--target",
                args.target,
            ]
        )
        if rc != 0:
            return rc
        rows = []
        for batch in args.batch or [1, 32]:
            x = np.resize(pool, (batch, *pool.shape[1:])).astype(np.float32)
            for label, path in (("FP32", model), ("INT8", int8)):
                rows.append((label, batch, _time(_session(path, args.threads), x, args.seconds)))
    print(f"\n{'model':<6} {'batch':>5} {'p50 ms':>9} {'p99 ms':>9} {'samples/s':>12}")
    for label, batch, r in rows:
        print(
            f"{label:<6} {batch:>5} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} {r['samples_s']:>12.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
