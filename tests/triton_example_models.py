"""Stand-ins for the models Triton's Python client examples expect (same names, inputs, outputs,
datatypes and configs), generated here: ONNX graphs for the stateless ones, Python models
written to Triton's API for the sequence and decoupled ones.

* `simple` (INT32) and `simple_int8` (INT8): INPUT0, INPUT1 [16] → OUTPUT0 = sum,
  OUTPUT1 = difference, `max_batch_size: 8`.
* `simple_string`: the same on BYTES tensors holding decimal numbers.
* `simple_identity`: BYTES INPUT0 → OUTPUT0.
* `custom_identity_int32`: INT32 INPUT0 [-1] → OUTPUT0.
* `simple_sequence`: INT32 INPUT [1] → OUTPUT = INPUT, plus 1 on the request that starts the
  sequence (what the examples check); takes integer and string correlation ids.
* `simple_dyna_sequence`: the same, plus the correlation id on the request that ends it.
* `repeat_int32` (decoupled): one response per element of IN (OUT = that element, IDX = its
  index), DELAY[i] microseconds apart.

* `densenet_onnx`: the image classifier's signature only (`grpc_client.py` sends no image).
* `simple_string_dyna_sequence`: sums per string correlation id, plus the id on the request
  that ends the sequence (the sequence examples' `-d` runs).

`MODEL_NAMES`: eight models, as the repository the gRPC model-control example counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import save_ready, write_model
from tests.python_models import write_python_model
from tests.server import running_agent


def add_sub_graph(name: str, elem: int) -> onnx.GraphProto:
    """INPUT0, INPUT1 [batch, 16] of `elem` → OUTPUT0 = sum, OUTPUT1 = difference."""
    inputs = [helper.make_tensor_value_info(n, elem, ["batch", 16]) for n in ("INPUT0", "INPUT1")]
    outputs = [
        helper.make_tensor_value_info(n, elem, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")
    ]
    if elem != TensorProto.STRING:
        nodes = [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ]
    else:  # decimal strings: parse, compute, format back
        nodes = [
            helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
            helper.make_node("Add", ["A", "B"], ["SUM"]),
            helper.make_node("Sub", ["A", "B"], ["DIFF"]),
            helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    return helper.make_graph(nodes, name, inputs, outputs)


def identity_graph(name: str, elem: int) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", elem, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", elem, ["batch", "n"])],
    )


def add_sub_config(name: str, datatype: str) -> str:
    tensors = ", ".join(
        f'{{ name: "{n}" data_type: {datatype} dims: [ 16 ] }}' for n in ("INPUT0", "INPUT1")
    )
    outs = ", ".join(
        f'{{ name: "{n}" data_type: {datatype} dims: [ 16 ] }}' for n in ("OUTPUT0", "OUTPUT1")
    )
    return f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {tensors} ]
output [ {outs} ]
"""


def identity_config(name: str, datatype: str) -> str:
    return f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {datatype} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ -1 ] }} ]
"""


def densenet_graph() -> onnx.GraphProto:
    """`densenet_onnx`'s signature (data_0 FP32 [3, 224, 224] → fc6_1 [1000, 1, 1]); the scores
    are the first 1000 input values: the examples that use it check only that it answers."""
    flat = helper.make_tensor("flat", TensorProto.INT64, [1], [-1])
    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [0])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [1000])
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [1000, 1, 1])
    return helper.make_graph(
        [
            helper.make_node("Reshape", ["data_0", "flat"], ["all"]),
            helper.make_node("Slice", ["all", "starts", "ends"], ["first"]),
            helper.make_node("Reshape", ["first", "shape"], ["fc6_1"]),
        ],
        "densenet_onnx",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1000, 1, 1])],
        [flat, starts, ends, shape],
    )


DENSENET_CONFIG = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000, 1, 1 ] } ]
"""


SEQUENCE_MODEL = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            out = value + start.astype(np.int32)
            end = pb_utils.get_input_tensor_by_name(request, "END")
            if end is not None and end.as_numpy().flat[0]:
                corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
                out = out + int(corrid.flat[0])
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out.astype(np.int32))])
            )
        return responses
"""


def sequence_config(name: str, *, dyna: bool, corrid_type: str = "TYPE_UINT64") -> str:
    controls = [
        '{ name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }'
    ]
    if dyna:
        controls += [
            '{ name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }',
            '{ name: "CORRID" control [ '
            f"{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}",
        ]
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  control_input [ {", ".join(controls)} ]
}}
"""


# `simple_string_dyna_sequence`: sums per string CORRID, plus that id (a decimal number) on the
# request that ends the sequence.
STRING_DYNA_MODEL = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().flat[0]
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy().flat[0]
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().flat[0]
            key = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            total = (0 if start else self.sums[key]) + int(value.flat[0])
            self.sums[key] = total
            if end:
                total += int(key)
                del self.sums[key]
            out = np.full(value.shape, total, np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""

REPEAT_MODEL = """
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._repeat, args=(request,), daemon=True).start()
        return None

    def _repeat(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        for i, value in enumerate(values):
            time.sleep(float(delays[i]) / 1e6)
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], np.int32)),
                        pb_utils.Tensor("IDX", np.array([i], np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

REPEAT_CONFIG = """
name: "repeat_int32"
backend: "python"
max_batch_size: 0
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
model_transaction_policy { decoupled: true }
"""

MODEL_NAMES = (
    "simple",
    "simple_int8",
    "simple_string",
    "simple_identity",
    "custom_identity_int32",
    "simple_sequence",
    "simple_dyna_sequence",
    "repeat_int32",
)


def write_example_repository(repo: Path, names: tuple[str, ...] = MODEL_NAMES) -> Path:
    """The stand-ins named in `names` (all eight by default) under `repo`."""
    add_sub = {"simple": "INT32", "simple_int8": "INT8", "simple_string": "STRING"}
    identity = {"simple_identity": "STRING", "custom_identity_int32": "INT32"}
    for name in names:
        if name in add_sub:
            elem = getattr(TensorProto, add_sub[name])
            config = add_sub_config(name, f"TYPE_{add_sub[name]}")
            write_model(repo, name, save_ready(add_sub_graph(name, elem)), config)
        elif name in identity:
            elem = getattr(TensorProto, identity[name])
            config = identity_config(name, f"TYPE_{identity[name]}")
            write_model(repo, name, save_ready(identity_graph(name, elem)), config)
        elif name == "simple_string_dyna_sequence":
            config = sequence_config(name, dyna=True, corrid_type="TYPE_STRING")
            write_python_model(repo, name, STRING_DYNA_MODEL, config)
        elif name == "densenet_onnx":
            write_model(repo, name, save_ready(densenet_graph()), DENSENET_CONFIG)
        elif name == "repeat_int32":
            write_python_model(repo, name, REPEAT_MODEL, REPEAT_CONFIG)
        else:
            dyna = name == "simple_dyna_sequence"
            write_python_model(repo, name, SEQUENCE_MODEL, sequence_config(name, dyna=dyna))
    return repo


@contextmanager
def example_agent(repo: Path, load: tuple[str, ...] = ("*",)) -> Iterator[RunningAgent]:
    """The agent as the examples expect Triton: named "triton", HTTP and gRPC on free ports,
    explicit model control with `load` loaded at start."""
    config = AgentConfig(
        server=ServerConfig(name="triton", http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=load,
        ),
    )
    with running_agent(config) as agent:
        yield agent
