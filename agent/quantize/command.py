"""`edge-agent quantize`: static INT8 (QDQ) quantization with an accuracy budget.

    edge-agent quantize model.onnx --calibration calib/ --output model.int8.onnx \\
        [--method minmax|entropy|percentile] [--per-channel] [--target tensorrt|cpu] \\
        [--eval eval.npz --budget 1.0] [--report report.json]

Steps: calibrate once with `onnxruntime.quantization.create_calibrator` over the sample folder;
write the TensorRT calibration table (`write_calibration_table`: calibration.cache/.flatbuffers/
.json, for the TensorRT execution provider's `trt_int8_calibration_table_name`); quantize with
`quantize_static` in QDQ format from the same ranges; with `--eval`, run both models on the CPU and
compare them (`agent.quantize.report`). Everything is written to temp files next to the outputs
first: when the INT8 model breaks the budget nothing but the report is written and the exit code is
3, so a broken model never lands where a publisher would pick it up.

`--target tensorrt` (the default) makes activations and weights symmetric INT8, which TensorRT
needs to build an engine from the QDQ model; `--target cpu` keeps asymmetric UINT8 activations,
usually a little more accurate on ONNX Runtime's CPU kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime import quantization as oq
from onnxruntime.quantization import calibrate as oq_calibrate

from agent.quantize import report as quantize_report
from agent.quantize.args import Method, Target, add_commands
from agent.quantize.data import (
    FolderCalibrationReader,
    InputSpec,
    QuantizeDataError,
    load_eval_data,
)
from model_cache.atomic import atomic_write_bytes, durable_rename, fsync_file

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_BUDGET = 3
EVAL_BATCH = 256
TABLE_FILES = ("calibration.cache", "calibration.flatbuffers", "calibration.json")


_METHODS = {
    Method.MINMAX: oq.CalibrationMethod.MinMax,
    Method.ENTROPY: oq.CalibrationMethod.Entropy,
    Method.PERCENTILE: oq.CalibrationMethod.Percentile,
}


@dataclass(frozen=True, slots=True)
class QuantizeOptions:
    """One quantization run, as the command line describes it."""

    model: Path
    calibration: Path
    output: Path
    method: Method = Method.MINMAX
    per_channel: bool = False
    target: Target = Target.TENSORRT
    percentile: float = 99.999
    eval_data: Path | None = None
    budget_pct: float | None = None
    report: Path | None = None
    table_dir: Path | None = None  # default: the output's folder


@dataclass(frozen=True, slots=True)
class QuantizeResult:
    """What a run wrote; `written` is False when the budget refused the model."""

    written: bool
    report: quantize_report.Report | None
    report_path: Path | None


class QuantizeError(Exception):
    """The model cannot be quantized (bad model, bad data, runtime refused it)."""


def input_specs(model: Path) -> list[InputSpec]:
    """The model's inputs (name, rank, numpy type), read with ONNX Runtime."""
    session = _cpu_session(model)
    specs = []
    for arg in session.get_inputs():
        dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}.get(arg.type)
        if dtype is None:
            raise QuantizeError(f"input '{arg.name}' is {arg.type}; only float inputs calibrate")
        specs.append(InputSpec(arg.name, len(arg.shape), np.dtype(dtype)))
    return specs


def _cpu_session(model: Path) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises untyped errors for bad models
        raise QuantizeError(f"onnxruntime cannot load {model}: {exc}") from None


def _calibrate(opts: QuantizeOptions, specs: Sequence[InputSpec], work: Path) -> tuple[Any, int]:
    """Collect activation ranges once over the sample folder; also returns the sample count."""
    extra: dict[str, Any] = {"symmetric": opts.target is Target.TENSORRT}
    if opts.method is Method.PERCENTILE:
        extra["percentile"] = opts.percentile
    calibrator = oq.create_calibrator(
        opts.model,
        [],
        augmented_model_path=str(work / "augmented.onnx"),
        calibrate_method=_METHODS[opts.method],
        extra_options=extra,
    )
    reader = FolderCalibrationReader(opts.calibration, specs)
    calibrator.collect_data(reader)
    return calibrator.compute_data(), reader.count


def _quantize(opts: QuantizeOptions, specs: Sequence[InputSpec], ranges: Any, dest: Path) -> None:
    """Write the QDQ model from the ranges `_calibrate` found (no second calibration pass)."""
    trt = opts.target is Target.TENSORRT
    kwargs: dict[str, Any] = {
        "quant_format": oq.QuantFormat.QDQ,
        "per_channel": opts.per_channel,
        "activation_type": oq.QuantType.QInt8 if trt else oq.QuantType.QUInt8,
        "weight_type": oq.QuantType.QInt8,
        "calibrate_method": _METHODS[opts.method],
        "extra_options": {"ActivationSymmetric": trt, "WeightSymmetric": True},
    }
    reader: FolderCalibrationReader | None = None
    if "calibration_cache_path" in inspect.signature(oq.quantize_static).parameters:
        cache = dest.parent / "ranges.json"
        oq_calibrate.save_tensors_data(ranges, cache)
        kwargs["calibration_cache_path"] = str(cache)
    else:  # onnxruntime < 1.23: it calibrates again over the same files
        reader = FolderCalibrationReader(opts.calibration, specs)
    oq.quantize_static(str(opts.model), str(dest), reader, **kwargs)


def _outputs(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The first output of the model over all samples, run in chunks on the CPU."""
    session = _cpu_session(model)
    name = session.get_outputs()[0].name
    total = next(iter(feeds.values())).shape[0]
    parts = [
        session.run([name], {k: v[i : i + EVAL_BATCH] for k, v in feeds.items()})[0]
        for i in range(0, total, EVAL_BATCH)
    ]
    return np.concatenate(parts, axis=0)


def evaluate(
    fp32_model: Path,
    int8_model: Path,
    data: Path,
    *,
    budget_pct: float | None,
    calibration: dict[str, Any],
) -> quantize_report.Report:
    """Compare an INT8 model with its FP32 source on evaluation data (CPU, ONNX Runtime).

    Raises:
        QuantizeDataError: the data does not fit the model.
        QuantizeError: a model cannot be loaded.
    """
    specs = input_specs(fp32_model)
    eval_data = load_eval_data(data, specs)
    feeds = dict(eval_data.feeds)
    report = quantize_report.compare(
        _outputs(fp32_model, feeds),
        _outputs(int8_model, feeds),
        eval_data.labels,
        budget_pct=budget_pct,
        calibration=calibration,
    )
    return replace(report, fp32_model_sha256=_sha256(fp32_model))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def quantize(opts: QuantizeOptions) -> QuantizeResult:
    """Calibrate, quantize, check the budget and write the outputs (all or nothing).

    Raises:
        QuantizeDataError: calibration or evaluation data is missing or does not fit.
        QuantizeError: the model cannot be loaded or quantized.
        OSError: an output cannot be written.
    """
    specs = input_specs(opts.model)
    table_dir = opts.table_dir or opts.output.parent
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    table_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=opts.output.parent) as tmp:
        work = Path(tmp)
        ranges, samples = _calibrate(opts, specs, work)
        oq.write_calibration_table(dict(ranges.data.items()), dir=str(work))
        staged = work / "model.int8.onnx"
        try:
            _quantize(opts, specs, ranges, staged)
        except (ValueError, RuntimeError) as exc:
            raise QuantizeError(f"quantize_static failed: {exc}") from None
        calibration = {
            "method": opts.method.value,
            "per_channel": opts.per_channel,
            "samples": samples,
            "target": opts.target.value,
        }
        report = None
        if opts.eval_data is not None:
            report = evaluate(
                opts.model,
                staged,
                opts.eval_data,
                budget_pct=opts.budget_pct,
                calibration=calibration,
            )
        report_path = None
        if report is not None:
            report_path = opts.report or opts.output.with_suffix(".report.json")
            atomic_write_bytes(report_path, report.to_json().encode())
            if not report.within_budget:
                return QuantizeResult(False, report, report_path)
        for name in TABLE_FILES:
            if (work / name).is_file():
                durable_rename(work / name, table_dir / name)
        fsync_file(staged)
        durable_rename(staged, opts.output)
        return QuantizeResult(True, report, report_path)


def run(args: argparse.Namespace) -> int:
    """Run `edge-agent quantize`; returns the exit code (3: refused by the budget)."""
    if args.budget is not None and args.eval_data is None:
        print("edge-agent quantize: --budget needs --eval", file=sys.stderr)
        return EXIT_ERROR
    opts = QuantizeOptions(
        model=args.model,
        calibration=args.calibration,
        output=args.output,
        method=Method(args.method),
        per_channel=args.per_channel,
        target=Target(args.target),
        percentile=args.percentile,
        eval_data=args.eval_data,
        budget_pct=args.budget,
        report=args.report,
        table_dir=args.table_dir,
    )
    try:
        result = quantize(opts)
    except (QuantizeError, QuantizeDataError, OSError) as exc:
        print(f"edge-agent quantize: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if result.report is not None:
        print(quantize_report.format_table(result.report))
    if not result.written:
        assert result.report is not None
        print(f"edge-agent quantize: {result.report.refusal()}", file=sys.stderr)
        return EXIT_BUDGET
    print(f"wrote {opts.output}" + (f" and {result.report_path}" if result.report_path else ""))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (`python -m agent.quantize.command`), as used by tests and benchmarks."""
    parser = argparse.ArgumentParser(prog="edge-agent")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
