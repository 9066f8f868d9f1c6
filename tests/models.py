"""ONNX models the tests generate (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from agent.proto import onnx_model_pb2 as onnx_pb
from agent.runtime.demo import IR_VERSION, OPSET, mlp_model, write_demo_repository

# KServe datatype → ONNX element type, for the identity model's inputs.
IDENTITY_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def identity_all_types_model() -> onnx.ModelProto:
    """IN_<TYPE> → OUT_<TYPE> for every supported type, shape [batch, 3]."""
    nodes, inputs, outputs = [], [], []
    for name, elem in IDENTITY_TYPES.items():
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", elem, ["batch", 3]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", elem, ["batch", 3]))
    graph = helper.make_graph(nodes, "identity_all", inputs, outputs)
    return save_ready(graph)


def flat_model() -> onnx.ModelProto:
    """FP32 [2, 6] → Y = X * 2, no batch dimension; served with a reshape to [3, 4]."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "two"], ["Y"])],
        "flat",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 6])],
        [two],
    )
    return save_ready(graph)


def scale_model(factor: float) -> onnx.ModelProto:
    """FP32 [1, 4] → Y = X * factor (no batch dimension): versions that answer differently."""
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [factor])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "k"], ["Y"])],
        "scale",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])],
        [k],
    )
    return save_ready(graph)


def add_sub_model(size: int = 4) -> onnx.ModelProto:
    """Triton's add_sub example as ONNX: FP32 [size] INPUT0, INPUT1 → OUTPUT0 = sum, OUTPUT1 =
    difference (no batch dimension, as the example's config)."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [size]),
            helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, [size]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [size]),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, [size]),
        ],
    )
    return save_ready(graph)


def save_ready(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def write_model(
    repo: Path,
    name: str,
    model: onnx.ModelProto | onnx_pb.ModelProto | Path,
    config: str | None = None,
    versions: tuple[int, ...] = (1,),
) -> Path:
    model_dir = repo / name
    for v in versions:
        (model_dir / str(v)).mkdir(parents=True, exist_ok=True)
        target = model_dir / str(v) / "model.onnx"
        if isinstance(model, Path):
            target.write_bytes(model.read_bytes())
        else:  # onnx's ModelProto or the agent's own (agent.runtime.demo's models)
            target.write_bytes(model.SerializeToString())
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


# The demo MLP served as "m" (FP32 [-1, 64] -> [-1, 10]), batches of up to 4.
M_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""

# A `scale_model` served with every version folder READY (format with the model's name).
VERSIONED_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
version_policy: {{ all: {{}} }}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1, 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] }} ]
"""


def write_versions(repo: Path, name: str, models: dict[int, onnx.ModelProto]) -> None:
    """A model folder with one version per entry of `models` and `VERSIONED_CONFIG`."""
    for version, model in models.items():
        (repo / name / str(version)).mkdir(parents=True)
        onnx.save(model, str(repo / name / str(version) / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(VERSIONED_CONFIG.format(name=name))


FLAT_CONFIG = """
name: "flat"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 2, 6 ] } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 2, 6 ] } } ]
"""


def build_test_repository(repo: Path) -> Path:
    """The demo models plus the test-only ones."""
    write_demo_repository(repo)
    write_model(repo, "identity_all", identity_all_types_model())
    write_model(repo, "flat", flat_model(), FLAT_CONFIG)
    return repo


def mlp_model_dir(repo: Path, name: str) -> Path:
    """A model folder holding the demo MLP as version 1, without config.pbtxt."""
    return write_model(repo, name, mlp_model())
