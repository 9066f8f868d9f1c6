"""The `quantize` sub-command's arguments and choices (cheap to import: no onnx).

`agent.quantize.command.run` does the work; the CLI imports it only for that command, so a serving
agent
never loads onnxruntime's quantization tools (and onnx with them).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any


class Method(Enum):
    """Calibration methods offered on the command line."""

    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class Target(Enum):
    """Where the INT8 model will run: decides symmetric vs asymmetric activations."""

    TENSORRT = "tensorrt"
    CPU = "cpu"


def add_commands(subparsers: Any) -> None:
    """Add `quantize` to the CLI's subcommands (`argparse` `add_subparsers()` result)."""
    cmd = subparsers.add_parser("quantize", help="static INT8 (QDQ) quantization of an ONNX model")
    cmd.add_argument("model", type=Path, help="FP32 ONNX model")
    cmd.add_argument("--calibration", type=Path, required=True, help="folder of .npy/.npz samples")
    cmd.add_argument("--output", type=Path, required=True, help="INT8 model to write")
    cmd.add_argument("--method", choices=[m.value for m in Method], default="minmax")
    cmd.add_argument("--percentile", type=float, default=99.999, help="for --method percentile")
    cmd.add_argument("--per-channel", action="store_true", help="per-channel weight scales")
    cmd.add_argument("--target", choices=[t.value for t in Target], default="tensorrt")
    cmd.add_argument("--eval", type=Path, dest="eval_data", help="labelled/reference data")
    cmd.add_argument("--budget", type=float, help="max accuracy drop, percentage points")
    cmd.add_argument("--report", type=Path, help="JSON report (default: OUTPUT.report.json)")
    cmd.add_argument("--table-dir", type=Path, help="calibration table folder (default: OUTPUT's)")
