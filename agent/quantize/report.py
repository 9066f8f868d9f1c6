"""The accuracy budget of an INT8 model: pure comparison of its outputs with the FP32 model's.

`compare` takes the two models' outputs (and labels when there are any) and returns a `Report`:
top-1 agreement, each model's accuracy and the drop, max/mean absolute output error. The budget is
in percentage points: with labels it bounds the accuracy drop, without labels (reference data) the
share of samples whose top-1 class changed. The report is JSON for tools and a table for people;
`sync.quantize_fields.publish_custom_fields` turns a written report into the custom field the
publisher signs into the
version's TUF targets metadata.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sync.quantize_fields import REPORT_SCHEMA


@dataclass(frozen=True, slots=True)
class Report:
    """What the INT8 model costs in accuracy, and whether that fits the budget."""

    samples: int
    top1_agreement_pct: float
    fp32_accuracy_pct: float | None  # None without labels
    int8_accuracy_pct: float | None
    drop_pct: float  # accuracy drop with labels, else 100 - agreement (percentage points)
    max_abs_error: float
    mean_abs_error: float
    budget_pct: float | None
    within_budget: bool
    calibration: Mapping[str, Any]  # method, per_channel, samples, target
    # SHA-256 of the FP32 model file the INT8 one came from: the publisher signs it into the
    # metadata, tying the figures to that model (whose own signed target carries the same digest)
    fp32_model_sha256: str = ""

    def to_json(self) -> str:
        """The report as JSON (with a schema tag), stable key order."""
        body = {"schema": REPORT_SCHEMA, **asdict(self)}
        body["calibration"] = dict(self.calibration)
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    def refusal(self) -> str:
        """The one line that says why the output was not written."""
        what = "accuracy drop" if self.fp32_accuracy_pct is not None else "top-1 disagreement"
        return (
            f"INT8 {what} {self.drop_pct:.2f} pp exceeds the budget of {self.budget_pct} pp; "
            "output not written"
        )


def _top1(output: np.ndarray) -> np.ndarray:
    """Class index per sample: argmax over everything but the batch dimension."""
    return np.asarray(np.asarray(output).reshape(output.shape[0], -1).argmax(axis=1))


def compare(
    fp32: np.ndarray,
    int8: np.ndarray,
    labels: np.ndarray | None,
    *,
    budget_pct: float | None,
    calibration: Mapping[str, Any],
) -> Report:
    """Compare the INT8 model's first output with the FP32 model's on the same samples.

    Args:
        fp32: FP32 output, batch first.
        int8: INT8 output, same shape.
        labels: class index per sample, or None for reference data.
        budget_pct: the largest allowed drop in percentage points; None: no budget.
        calibration: how the INT8 model was calibrated (copied into the report).

    Raises:
        ValueError: the outputs or labels do not line up.

    Returns:
        The report.
    """
    if fp32.shape != int8.shape or fp32.ndim == 0 or fp32.shape[0] == 0:
        raise ValueError(f"outputs differ in shape: FP32 {fp32.shape}, INT8 {int8.shape}")
    samples = int(fp32.shape[0])
    ref, got = _top1(fp32), _top1(int8)
    agreement = 100.0 * float(np.mean(ref == got))
    error = np.abs(fp32.astype(np.float64) - int8.astype(np.float64))
    fp32_acc = int8_acc = None
    if labels is not None:
        if labels.shape[0] != samples:
            raise ValueError(f"{labels.shape[0]} labels for {samples} samples")
        fp32_acc = 100.0 * float(np.mean(ref == labels))
        int8_acc = 100.0 * float(np.mean(got == labels))
        drop = fp32_acc - int8_acc
    else:
        drop = 100.0 - agreement
    max_err = float(error.max())
    mean_err = float(error.mean())
    finite = math.isfinite(max_err)
    within = finite and (budget_pct is None or drop <= budget_pct)
    return Report(
        samples=samples,
        top1_agreement_pct=round(agreement, 4),
        fp32_accuracy_pct=None if fp32_acc is None else round(fp32_acc, 4),
        int8_accuracy_pct=None if int8_acc is None else round(int8_acc, 4),
        drop_pct=round(drop, 4),
        max_abs_error=max_err if finite else float("inf"),
        mean_abs_error=mean_err,
        budget_pct=budget_pct,
        within_budget=within,
        calibration=dict(calibration),
    )


def format_table(report: Report) -> str:
    """The report as a two-column text table for the terminal."""

    def pct(value: float | None) -> str:
        return "n/a (no labels)" if value is None else f"{value:.2f} %"

    rows = [
        ("samples", str(report.samples)),
        ("FP32 accuracy", pct(report.fp32_accuracy_pct)),
        ("INT8 accuracy", pct(report.int8_accuracy_pct)),
        ("drop (pp)", f"{report.drop_pct:.2f}"),
        ("top-1 agreement", pct(report.top1_agreement_pct)),
        ("max |error|", f"{report.max_abs_error:.6g}"),
        ("mean |error|", f"{report.mean_abs_error:.6g}"),
        ("budget (pp)", "none" if report.budget_pct is None else f"{report.budget_pct:.2f}"),
        ("within budget", "yes" if report.within_budget else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
