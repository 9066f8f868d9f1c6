"""The `quantization` fields a publisher signs into a version's targets, from a quantize report.

The report is written by `edge-agent quantize --report`; its schema name and size cap live here,
with the reader, so that `sync/` never imports the agent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

REPORT_SCHEMA = "edge-agent.quantize-report/1"
MAX_REPORT_BYTES = 64 * 1024  # the signed metadata carries it; keep it small


def publish_custom_fields(report_path: Path) -> dict[str, Any]:
    """The `quantization` custom field to sign into a version's TUF target entries.

    Only the numbers a device or an operator decides on are kept (no free text from the file), so
    the signed metadata stays small and its shape fixed.

    Args:
        report_path: a report written by `edge-agent quantize --report`.

    Raises:
        ValueError: the file is too large, not a quantize report, or lacks a field.
        OSError: the file cannot be read.

    Returns:
        `{"quantization": {...}}`, to merge into the target's `custom` dict.
    """
    if report_path.stat().st_size > MAX_REPORT_BYTES:
        raise ValueError(f"{report_path} is over {MAX_REPORT_BYTES} bytes")
    body = json.loads(report_path.read_text())
    if not isinstance(body, dict) or body.get("schema") != REPORT_SCHEMA:
        raise ValueError(f"{report_path} is not an edge-agent quantize report")
    keys = (
        "samples",
        "top1_agreement_pct",
        "fp32_accuracy_pct",
        "int8_accuracy_pct",
        "drop_pct",
        "max_abs_error",
        "mean_abs_error",
        "budget_pct",
        "within_budget",
    )
    missing = [k for k in keys if k not in body]
    if missing:
        raise ValueError(f"{report_path} lacks {', '.join(missing)}")
    calibration = body.get("calibration", {})
    fields: dict[str, Any] = {k: body[k] for k in keys}
    fields["calibration"] = {
        k: calibration[k]
        for k in ("method", "per_channel", "samples", "target")
        if isinstance(calibration, dict) and k in calibration
    }
    source = body.get("fp32_model_sha256", "")
    if source:  # the FP32 model the figures were measured against (its signed target's digest)
        if not (isinstance(source, str) and len(source) == 64):
            raise ValueError(f"{report_path}: fp32_model_sha256 is not a SHA-256")
        fields["fp32_model_sha256"] = source
    fields["report_sha256"] = hashlib.sha256(report_path.read_bytes()).hexdigest()
    return {"quantization": fields}
