"""A stateful ONNX model for the sequence batcher, shared by its tests and its benchmark."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from agent.runtime.demo import IR_VERSION, OPSET


def accumulator_model(scale: float = 1.0, width: int = 1) -> onnx.ModelProto:
    """A stateful model: OUTPUT = S_IN * (1 - START) + scale * INPUT * READY.

    S_OUT = OUTPUT is the implicit state fed back as S_IN with the sequence's next request;
    CORRID_OUT echoes the correlation id the batcher fed in CORRID. INPUT, S_IN, OUTPUT and S_OUT
    are [batch, width], the controls and CORRID_OUT [batch, 1].
    """
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [scale])
    nodes = [
        helper.make_node("Cast", ["START"], ["startf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "startf"], ["keep"]),
        helper.make_node("Mul", ["S_IN", "keep"], ["prev"]),
        helper.make_node("Mul", ["INPUT", "READY"], ["x"]),
        helper.make_node("Mul", ["x", "k"], ["xs"]),
        helper.make_node("Add", ["prev", "xs"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["S_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    row: list[str | int | None] = ["batch", width]
    flag: list[str | int | None] = ["batch", 1]
    graph = helper.make_graph(
        nodes,
        "accumulator",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, row),
            helper.make_tensor_value_info("START", TensorProto.INT32, flag),
            helper.make_tensor_value_info("READY", TensorProto.FLOAT, flag),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, flag),
            helper.make_tensor_value_info("S_IN", TensorProto.FLOAT, row),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, row),
            helper.make_tensor_value_info("S_OUT", TensorProto.FLOAT, row),
            helper.make_tensor_value_info("CORRID_OUT", TensorProto.UINT64, flag),
        ],
        [one, k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


# `accumulator_model` with a sequence batcher (format: name, strategy block, idle microseconds).
ACCUMULATOR_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
version_policy: {{ specific {{ versions: [ 1 ] }} }}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{
    input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state: {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" }}
  }} ]
}}
"""
