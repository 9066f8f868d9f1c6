"""Benchmark models and repositories, generated locally with the `onnx` helper API.

    mlp   the demo MLP, FP32 [-1, 64] -> 256 -> 10 softmax (agent.runtime.demo.mlp_model)
    cnn   a MobileNetV2-shaped CNN, FP32 [-1, 3, 224, 224] -> [-1, 1000], random weights

Each model is written twice, as a "nobatch" repository (max_batch_size 32, no scheduler block)
and as a "dynbatch" repository (the same plus a dynamic_batching block), so the agent can be
measured with and without server-side batching on identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.runtime.demo import IR_VERSION, OPSET, mlp_model

# MobileNetV2's inverted residual table: expansion t, output channels c, repeats n, stride s.
MOBILENETV2_BLOCKS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
CNN_IMAGE = (3, 224, 224)
CNN_CLASSES = 1000
MAX_BATCH = 32


class _GraphBuilder:
    """Collects nodes and initializers; conv weights use He-normal init so activations stay sane."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0
        self.inits += [
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "relu6_min"),
            numpy_helper.from_array(np.array(6.0, dtype=np.float32), "relu6_max"),
        ]

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def conv(
        self, x: str, c_in: int, c_out: int, kernel: int, stride: int = 1, group: int = 1
    ) -> str:
        """Conv with bias (batch norm folded in, as an exported inference graph would have it)."""
        name = self._name("conv")
        fan_in = (c_in // group) * kernel * kernel
        weight = self.rng.standard_normal((c_out, c_in // group, kernel, kernel)) * np.sqrt(
            2.0 / fan_in
        )
        bias = self.rng.standard_normal(c_out) * 0.01
        self.inits += [
            numpy_helper.from_array(weight.astype(np.float32), f"{name}_w"),
            numpy_helper.from_array(bias.astype(np.float32), f"{name}_b"),
        ]
        pad = kernel // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}_w", f"{name}_b"],
                [name],
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
                group=group,
            )
        )
        return name

    def relu6(self, x: str) -> str:
        name = self._name("relu6")
        self.nodes.append(helper.make_node("Clip", [x, "relu6_min", "relu6_max"], [name]))
        return name

    def add(self, a: str, b: str) -> str:
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [name]))
        return name

    def inverted_residual(self, x: str, c_in: int, c_out: int, stride: int, expand: int) -> str:
        """1x1 expand (skipped when t = 1), 3x3 depthwise, linear 1x1 project, residual add."""
        hidden = c_in * expand
        h = x
        if expand != 1:
            h = self.relu6(self.conv(h, c_in, hidden, 1))
        h = self.relu6(self.conv(h, hidden, hidden, 3, stride=stride, group=hidden))
        h = self.conv(h, hidden, c_out, 1)
        if stride == 1 and c_in == c_out:
            h = self.add(x, h)
        return h


def mobilenetv2_like(seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV2-shaped classifier (width 1.0): INPUT0 [-1, 3, 224, 224] -> OUTPUT0 [-1, 1000].

    Stem 3x3/2 conv to 32 channels, the 17 inverted residual blocks of MOBILENETV2_BLOCKS,
    1x1 conv to 1280, global average pool, fully connected to 1000 logits. ReLU6 is Clip(0, 6);
    batch norm is folded into conv biases. About 3.5 M parameters, 0.3 GFLOPs per image.
    """
    g = _GraphBuilder(seed)
    x = g.relu6(g.conv("INPUT0", CNN_IMAGE[0], 32, 3, stride=2))
    c_in = 32
    for expand, c_out, repeats, stride in MOBILENETV2_BLOCKS:
        for i in range(repeats):
            x = g.inverted_residual(x, c_in, c_out, stride if i == 0 else 1, expand)
            c_in = c_out
    x = g.relu6(g.conv(x, c_in, 1280, 1))
    g.nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"], axis=1),
        helper.make_node("Gemm", ["features", "fc_w", "fc_b"], ["OUTPUT0"], transB=1),
    ]
    g.inits += [
        numpy_helper.from_array(
            (g.rng.standard_normal((CNN_CLASSES, 1280)) * np.sqrt(1.0 / 1280)).astype(np.float32),
            "fc_w",
        ),
        numpy_helper.from_array(np.zeros(CNN_CLASSES, dtype=np.float32), "fc_b"),
    ]
    graph = helper.make_graph(
        g.nodes,
        "mobilenetv2_like",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", *CNN_IMAGE])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", CNN_CLASSES])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True, slots=True)
class BenchModel:
    """One benchmark model: how to build it and how to serve it."""

    key: str  # the --models name
    served_name: str  # the model's name in the repository
    input_dims: tuple[int, ...]  # without the batch dimension
    output_dims: tuple[int, ...]
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    # Instances in the dynbatch repository (ONNX Runtime threads split between them): a
    # depthwise CNN on 2 cores runs 15% faster as two 1-thread sessions than one 2-thread one.
    dynbatch_instances: int
    min_interval_ms: int  # shortest perf_analyzer window that still holds enough completions

    def build(self) -> onnx.ModelProto:
        if self.key == "mlp":
            return onnx.load_from_string(mlp_model(seed=1).SerializeToString())
        if self.key == "cnn":
            return mobilenetv2_like(seed=0)
        raise ValueError(f"unknown benchmark model {self.key!r}")

    def sample(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        """Random FP32 input of the given batch size."""
        return rng.random((batch, *self.input_dims), dtype=np.float32)


MODELS: dict[str, BenchModel] = {
    "mlp": BenchModel(
        key="mlp",
        served_name="mlp",
        input_dims=(64,),
        output_dims=(10,),
        preferred_batch_sizes=(8, 16, 32),
        max_queue_delay_us=300,
        dynbatch_instances=1,
        min_interval_ms=0,
    ),
    "cnn": BenchModel(
        key="cnn",
        served_name="mobilenetv2",
        input_dims=CNN_IMAGE,
        output_dims=(CNN_CLASSES,),
        preferred_batch_sizes=(4, 8),
        max_queue_delay_us=2000,
        dynbatch_instances=2,
        min_interval_ms=2500,
    ),
}

MODES = ("nobatch", "dynbatch")


def _dims(dims: tuple[int, ...]) -> str:
    return ", ".join(str(d) for d in dims)


def instances(model: BenchModel, mode: str) -> int:
    """CPU instances of the model in a repository mode."""
    return model.dynbatch_instances if mode == "dynbatch" else 1


def config_pbtxt(model: BenchModel, mode: str) -> str:
    """The model's config.pbtxt for a repository mode ("nobatch" or "dynbatch")."""
    if mode not in MODES:
        raise ValueError(f"unknown repository mode {mode!r}")
    text = f"""\
name: "{model.served_name}"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [
  {{
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ {_dims(model.input_dims)} ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ {_dims(model.output_dims)} ]
  }}
]
instance_group [ {{ count: {instances(model, mode)}, kind: KIND_CPU }} ]
"""
    if mode == "dynbatch":
        text += f"""\
dynamic_batching {{
  preferred_batch_size: [ {_dims(model.preferred_batch_sizes)} ]
  max_queue_delay_microseconds: {model.max_queue_delay_us}
}}
"""
    return text


def write_model_files(root: Path, models: list[BenchModel]) -> dict[str, Path]:
    """Save each model once as `root/onnx/KEY.onnx`; returns key -> path."""
    out = root / "onnx"
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for model in models:
        path = out / f"{model.key}.onnx"
        onnx.save(model.build(), str(path))
        paths[model.key] = path
    return paths


def write_repository(root: Path, model: BenchModel, mode: str, onnx_path: Path) -> Path:
    """A one-model repository `root/MODE-KEY/` (config.pbtxt and 1/model.onnx); returns its path."""
    repo = root / f"{mode}-{model.key}"
    version = repo / model.served_name / "1"
    version.mkdir(parents=True, exist_ok=True)
    target = version / "model.onnx"
    try:
        target.hardlink_to(onnx_path)
    except OSError:
        target.write_bytes(onnx_path.read_bytes())
    (repo / model.served_name / "config.pbtxt").write_text(
        config_pbtxt(model, mode), encoding="utf-8"
    )
    return repo


def write_mlp_repositories(root: Path, *modes: str) -> dict[str, Path]:
    """The benchmark MLP written once under `root`, served as each of `modes` (mode -> path)."""
    model = MODELS["mlp"]
    onnx_path = write_model_files(root, [model])["mlp"]
    return {mode: write_repository(root, model, mode, onnx_path) for mode in modes}
