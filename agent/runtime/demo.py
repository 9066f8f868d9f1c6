"""The built-in demo repository, generated locally (nothing downloaded, no onnx package).

    mlp_classifier/   FP32 [-1, 64] → 256 → 10 softmax; versions 1 and 2 (different weights);
                      a config.pbtxt with the usual Triton blocks.
    mixed_add/        A: FP32 [-1, 4], B: INT32 [-1, 4] → SUM = A + B, DIFF = A - B (FP32);
                      no config.pbtxt: auto-complete fills it from the model.

The models are written with the agent's own generated code for ONNX's model format
(`agent/proto/onnx_model.proto`, ONNX's field numbers), so `serve --demo` works from the base
install: the `onnx` package (26 MB installed, about 11 MiB of RSS) is the `quantize` extra's.
The tests check the result with `onnx.checker` and load it in ONNX Runtime.

Generation writes into a temporary folder beside the target and renames it into place, so an
interrupted run never leaves a half-written repository; the agent runs it in a child process
(`ensure_demo_repository`), so the serving process never holds numpy's random generator.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.proto import onnx_model_pb2 as onnx_pb

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
) -> onnx_pb.ModelProto:
    """A two-layer MLP classifier with a dynamic batch dimension and random weights."""
    rng = np.random.default_rng(seed)
    inits = [
        _tensor("W1", (rng.standard_normal((in_dim, hidden)) * 0.1).astype(np.float32)),
        _tensor("B1", (rng.standard_normal(hidden) * 0.1).astype(np.float32)),
        _tensor("W2", (rng.standard_normal((hidden, out_dim)) * 0.1).astype(np.float32)),
        _tensor("B2", (rng.standard_normal(out_dim) * 0.1).astype(np.float32)),
    ]
    nodes = [
        _node("Gemm", ["INPUT0", "W1", "B1"], ["H"]),
        _node("Relu", ["H"], ["HR"]),
        _node("Gemm", ["HR", "W2", "B2"], ["LOGITS"]),
        _node("Softmax", ["LOGITS"], ["OUTPUT0"], axis=1),
    ]
    graph = onnx_pb.GraphProto(
        name="mlp_classifier",
        node=nodes,
        initializer=inits,
        input=[_value("INPUT0", FLOAT, ["batch", in_dim])],
        output=[_value("OUTPUT0", FLOAT, ["batch", out_dim])],
    )
    return _finish(graph)


def mixed_add_model() -> onnx_pb.ModelProto:
    """Two inputs of different types: SUM = A + float(B), DIFF = A - float(B)."""
    nodes = [
        _node("Cast", ["B"], ["BF"], to=FLOAT),
        _node("Add", ["A", "BF"], ["SUM"]),
        _node("Sub", ["A", "BF"], ["DIFF"]),
    ]
    graph = onnx_pb.GraphProto(
        name="mixed_add",
        node=nodes,
        input=[_value("A", FLOAT, ["batch", 4]), _value("B", INT32, ["batch", 4])],
        output=[_value("SUM", FLOAT, ["batch", 4]), _value("DIFF", FLOAT, ["batch", 4])],
    )
    return _finish(graph)


FLOAT = onnx_pb.TensorProto.FLOAT
INT32 = onnx_pb.TensorProto.INT32
_DATA_TYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.int32): INT32}


def _tensor(name: str, array: np.ndarray) -> onnx_pb.TensorProto:
    """An initializer: dims, element type and little-endian raw bytes (as numpy_helper writes)."""
    return onnx_pb.TensorProto(
        name=name,
        dims=list(array.shape),
        data_type=_DATA_TYPES[array.dtype],
        raw_data=np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes(),
    )


def _node(
    op_type: str, inputs: Sequence[str], outputs: Sequence[str], **ints: int
) -> onnx_pb.NodeProto:
    """A node of the default domain; keyword arguments are its INT attributes."""
    attributes = [
        onnx_pb.AttributeProto(name=key, type=onnx_pb.AttributeProto.INT, i=value)
        for key, value in sorted(ints.items())
    ]
    return onnx_pb.NodeProto(op_type=op_type, input=inputs, output=outputs, attribute=attributes)


def _value(name: str, elem_type: int, dims: Sequence[int | str]) -> onnx_pb.ValueInfoProto:
    """A graph input or output: a tensor type whose dims are sizes or symbolic names."""
    shape = onnx_pb.TensorShapeProto(
        dim=[
            onnx_pb.TensorShapeProto.Dimension(dim_param=d)
            if isinstance(d, str)
            else onnx_pb.TensorShapeProto.Dimension(dim_value=d)
            for d in dims
        ]
    )
    tensor = onnx_pb.TypeProto.Tensor(elem_type=elem_type, shape=shape)
    return onnx_pb.ValueInfoProto(name=name, type=onnx_pb.TypeProto(tensor_type=tensor))


def _finish(graph: onnx_pb.GraphProto) -> onnx_pb.ModelProto:
    return onnx_pb.ModelProto(
        ir_version=IR_VERSION,
        producer_name="edge-agent",
        opset_import=[onnx_pb.OperatorSetIdProto(domain="", version=OPSET)],
        graph=graph,
    )


def demo_repository_ready(target: Path) -> bool:
    """Whether a complete demo repository is at `target` (it is renamed into place whole)."""
    return (target / "mlp_classifier" / "config.pbtxt").is_file()


def ensure_demo_repository(target: Path) -> Path:
    """The demo repository at `target`, generated by a child process if it is not there yet.

    Raises:
        RuntimeError: the generation failed (its stderr is in the message).
    """
    if demo_repository_ready(target):
        return target
    done = subprocess.run(
        [sys.executable, "-m", "agent.runtime.demo", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not demo_repository_ready(target):
        raise RuntimeError(f"could not write the demo repository at {target}: {done.stderr}")
    return target


def write_demo_repository(target: Path) -> Path:
    """Create the demo repository at `target` unless it is already there; returns `target`."""
    if demo_repository_ready(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
    try:
        mlp = staging / "mlp_classifier"
        for version, seed in ((1, 1), (2, 2)):
            (mlp / str(version)).mkdir(parents=True)
            (mlp / str(version) / "model.onnx").write_bytes(
                mlp_model(seed=seed).SerializeToString()
            )
        (mlp / "config.pbtxt").write_text(MLP_CONFIG, encoding="utf-8")
        mixed = staging / "mixed_add" / "1"
        mixed.mkdir(parents=True)
        (mixed / "model.onnx").write_bytes(mixed_add_model().SerializeToString())
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    write_demo_repository(Path(sys.argv[1]))
