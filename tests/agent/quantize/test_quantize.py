"""`edge-agent quantize` end to end on the CPU with a digits classifier trained by the test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agent.quantize.command import EXIT_BUDGET, main
from sync.quantize_fields import REPORT_SCHEMA, publish_custom_fields
from tests.agent.quantize.digits import Digits, write_calibration

BUDGET = 2.0  # percentage points


def quantize(files: Path, out: Path, *extra: str, calib: str = "calib") -> int:
    return main(
        [
            "quantize",
            str(files / "model.onnx"),
            "--calibration",
            str(files / calib),
            "--output",
            str(out / "model.onnx"),
            *extra,
        ]
    )


def test_quantize_reports_accuracy_against_fp32(
    digits_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--eval", str(digits_files / "eval.npz"), "--budget", str(BUDGET))
    assert quantize(digits_files, tmp_path, *args) == 0
    report = json.loads((tmp_path / "model.report.json").read_text())
    assert report["schema"] == REPORT_SCHEMA
    assert report["samples"] == 597
    assert report["fp32_accuracy_pct"] > 90
    assert report["int8_accuracy_pct"] > 90
    assert report["drop_pct"] == pytest.approx(
        report["fp32_accuracy_pct"] - report["int8_accuracy_pct"], abs=1e-3
    )
    assert report["drop_pct"] <= BUDGET
    assert report["within_budget"] is True
    assert report["calibration"] == {
        "method": "minmax",
        "per_channel": False,
        "samples": 129,
        "target": "tensorrt",
    }
    # The INT8 model is QDQ and the TensorRT calibration table sits next to it.
    model_bytes = (tmp_path / "model.onnx").read_bytes()
    assert b"QuantizeLinear" in model_bytes
    assert b"DequantizeLinear" in model_bytes
    table = (tmp_path / "calibration.cache").read_text().splitlines()
    assert any(line.startswith("INPUT0 ") for line in table)
    assert (tmp_path / "calibration.flatbuffers").stat().st_size > 0
    out = capsys.readouterr().out
    assert "FP32 accuracy" in out
    assert "INT8 accuracy" in out
    assert "within budget    yes" in out


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("entropy", ()),
        ("percentile", ()),
        ("minmax", ("--per-channel",)),
        ("minmax", ("--target", "cpu")),
    ],
)
def test_methods_and_options_stay_in_budget(
    digits_files: Path, tmp_path: Path, method: str, extra: tuple[str, ...]
) -> None:
    args = ("--method", method, *extra, "--eval", str(digits_files / "eval.npz"))
    # Per-channel Gemm weights cost this tiny MLP ~2.2 pp (measured), hence the looser budget.
    assert quantize(digits_files, tmp_path, *args, "--budget", "3.0") == 0
    report = json.loads((tmp_path / "model.report.json").read_text())
    assert report["calibration"]["method"] == method
    assert report["drop_pct"] <= 3.0


@pytest.mark.parametrize("scale", [1000.0, 0.0], ids=["scaled-x1000", "all-zeros"])
def test_broken_calibration_is_refused(
    digits: Digits,
    digits_files: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    scale: float,
) -> None:
    write_calibration(tmp_path / "bad", digits.x_train, scale=scale)
    args = ("--eval", str(digits_files / "eval.npz"), "--budget", str(BUDGET))
    out = tmp_path / "out"
    rc = main(
        [
            "quantize",
            str(digits_files / "model.onnx"),
            "--calibration",
            str(tmp_path / "bad"),
            "--output",
            str(out / "model.onnx"),
            *args,
        ]
    )
    assert rc == EXIT_BUDGET
    assert not (out / "model.onnx").exists()
    assert not (out / "calibration.cache").exists()
    assert sorted(p.name for p in out.iterdir()) == ["model.report.json"]  # no temp files left
    report = json.loads((out / "model.report.json").read_text())
    assert report["within_budget"] is False
    assert report["drop_pct"] > BUDGET
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "exceeds the budget of 2.0 pp; output not written" in err[0]


def test_reference_data_without_labels_budgets_top1_agreement(
    digits_files: Path, tmp_path: Path
) -> None:
    args = ("--eval", str(digits_files / "reference.npz"), "--budget", str(BUDGET))
    assert quantize(digits_files, tmp_path, *args) == 0
    report = json.loads((tmp_path / "model.report.json").read_text())
    assert report["fp32_accuracy_pct"] is None
    assert report["drop_pct"] == pytest.approx(100 - report["top1_agreement_pct"], abs=1e-3)
    assert report["max_abs_error"] >= report["mean_abs_error"] > 0


def test_budget_needs_eval(digits_files: Path, tmp_path: Path) -> None:
    assert quantize(digits_files, tmp_path, "--budget", "1") == 2
    assert not (tmp_path / "model.onnx").exists()


def test_missing_calibration_folder_is_an_error(digits_files: Path, tmp_path: Path) -> None:
    assert quantize(digits_files, tmp_path, calib="nope") == 2


def test_report_becomes_the_publisher_custom_field(digits_files: Path, tmp_path: Path) -> None:
    args = ("--eval", str(digits_files / "eval.npz"), "--report", str(tmp_path / "r.json"))
    assert quantize(digits_files, tmp_path, *args) == 0
    custom = publish_custom_fields(tmp_path / "r.json")
    fields = custom["quantization"]
    assert fields["within_budget"] is True
    assert fields["budget_pct"] is None
    assert fields["calibration"]["method"] == "minmax"
    assert len(fields["report_sha256"]) == 64
    fp32 = hashlib.sha256((digits_files / "model.onnx").read_bytes()).hexdigest()
    assert fields["fp32_model_sha256"] == fp32  # the figures are tied to the FP32 model's digest
    json.dumps(custom)  # goes into signed JSON metadata as is
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="not an edge-agent quantize report"):
        publish_custom_fields(tmp_path / "other.json")


def test_calibration_sample_without_batch_dimension_is_accepted(
    digits: Digits, digits_files: Path, tmp_path: Path
) -> None:
    np.save(tmp_path / "one.npy", digits.x_train[5])  # shape [64]
    rc = main(
        [
            "quantize",
            str(digits_files / "model.onnx"),
            "--calibration",
            str(tmp_path),
            "--output",
            str(tmp_path / "out" / "model.onnx"),
        ]
    )
    assert rc == 0
