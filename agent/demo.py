"""The built-in demo repository, generated locally with the `onnx` helper API (nothing downloaded).

    mlp_classifier/   FP32 [-1, 64] → 256 → 10 softmax; versions 1 and 2 (different weights);
                      a config.pbtxt with the usual Triton blocks.
    mixed_add/        A: FP32 [-1, 4], B: INT32 [-1, 4] → SUM = A + B, DIFF = A - B (FP32);
                      no config.pbtxt: auto-complete fills it from the model.

Generation writes into a temporary folder beside the target and renames it into place, so an
interrupted run never leaves a half-written repository.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by older ONNX Runtime builds found on Jetson images

MLP_CONFIG = """\
name: "mlp_classifier"
platform: "onnxruntime_onnx"
max_batch_size: 32
version_policy: { all { } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 200
}
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 64 ] zero_data: true } }
  }
]
"""


def default_demo_dir() -> Path:
    """Where the demo repository lives: the user's cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edge-agent" / "demo-repository"


def mlp_model(
    in_dim: int = 64, hidden: int = 256, out_dim: int = 10, seed: int = 1
) -> onnx.ModelProto:
    """A two-layer MLP classifier with a dynamic batch dimension and random weights."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((in_dim, hidden)) * 0.1).astype(np.float32), "W1"
        ),
        numpy_helper.from_array((rng.standard_normal(hidden) * 0.1).astype(np.float32), "B1"),
        numpy_helper.from_array(
            (rng.standard_normal((hidden, out_dim)) * 0.1).astype(np.float32), "W2"
        ),
        numpy_helper.from_array((rng.standard_normal(out_dim) * 0.1).astype(np.float32), "B2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["INPUT0", "W1", "B1"], ["H"]),
        helper.make_node("Relu", ["H"], ["HR"]),
        helper.make_node("Gemm", ["HR", "W2", "B2"], ["LOGITS"]),
        helper.make_node("Softmax", ["LOGITS"], ["OUTPUT0"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp_classifier",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", in_dim])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", out_dim])],
        inits,
    )
    return _finish(graph)


def mixed_add_model() -> onnx.ModelProto:
    """Two inputs of different types: SUM = A + float(B), DIFF = A - float(B)."""
    nodes = [
        helper.make_node("Cast", ["B"], ["BF"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["A", "BF"], ["SUM"]),
        helper.make_node("Sub", ["A", "BF"], ["DIFF"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed_add",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("B", TensorProto.INT32, ["batch", 4]),
        ],
        [
            helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("DIFF", TensorProto.FLOAT, ["batch", 4]),
        ],
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def write_demo_repository(target: Path) -> Path:
    """Create the demo repository at `target` unless it is already there; returns `target`."""
    if (target / "mlp_classifier" / "config.pbtxt").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
    try:
        mlp = staging / "mlp_classifier"
        for version, seed in ((1, 1), (2, 2)):
            (mlp / str(version)).mkdir(parents=True)
            onnx.save(mlp_model(seed=seed), str(mlp / str(version) / "model.onnx"))
        (mlp / "config.pbtxt").write_text(MLP_CONFIG, encoding="utf-8")
        mixed = staging / "mixed_add" / "1"
        mixed.mkdir(parents=True)
        onnx.save(mixed_add_model(), str(mixed / "model.onnx"))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
