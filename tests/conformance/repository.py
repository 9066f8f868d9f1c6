"""The model repository both servers serve: Python models written to Triton's API (they import
`triton_python_backend_utils`, as models written for Triton do), an ensemble of them, and
configs that break Triton's rules.

Every model is small and deterministic so that both servers' answers can be compared as data.
"""

from __future__ import annotations

from pathlib import Path

# Triton's datatypes the Python backend carries (BF16 needs torch; left out), config spelling.
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip

ALL_TYPES_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.names = [i["name"] for i in __import__("json").loads(args["model_config"])["input"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in self.names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUT" + name[2:], tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def all_types_config() -> str:
    inputs = ",\n".join(
        f'  {{ name: "IN_{dt}" data_type: TYPE_{"STRING" if dt == "BYTES" else dt} '
        "dims: [ -1 ] optional: true }"
        for dt in DATATYPES
    )
    outputs = ",\n".join(
        f'  {{ name: "OUT_{dt}" data_type: TYPE_{"STRING" if dt == "BYTES" else dt} dims: [ -1 ] }}'
        for dt in DATATYPES
    )
    head = 'name: "all_types"\nbackend: "python"\nmax_batch_size: 0\n'
    return f"{head}input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"


ADD_SUB_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT1", a - b),
                pb_utils.Tensor("OUTPUT0", a + b),
            ]))
        return responses
"""

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                )
            ])
            for r in requests
        ]
"""

IDENTITY_CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# CODE [1] INT32 picks what the model does: 0 answers OUT = CODE; 10+c returns TritonError code c
# in the response; 20+c raises it; 30 raises TritonModelException; 31 raises ValueError;
# 32 returns a TritonError without a code.
ERRORS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


NAMES = [
    "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
    "ALREADY_EXISTS", "CANCELLED",
]


class TritonPythonModel:
    def execute(self, requests):
        # Triton's pb_utils has TritonError only once the model runs, not at import
        CODES = [getattr(pb_utils.TritonError, n) for n in NAMES]
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            if 20 <= code < 30:
                raise pb_utils.TritonError("raised code " + str(code - 20), CODES[code - 20])
            if code == 30:
                raise pb_utils.TritonModelException("model exception")
            if code == 31:
                raise ValueError("plain value error")
            if 10 <= code < 20:
                error = pb_utils.TritonError("returned code " + str(code - 10), CODES[code - 10])
                responses.append(pb_utils.InferenceResponse(error=error))
            elif code == 32:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("no code")))
            else:
                out = np.array([code], dtype=np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

ERRORS_CONFIG = """
name: "errors"
backend: "python"
max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# The request's parameters and id come back as outputs. (Triton 2.51's InferenceResponse takes
# no `parameters`; later releases do, and so does ours: tests/agent/pb_utils cover it.)
PARAMS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            outputs = [
                pb_utils.Tensor(
                    "PARAMS", np.array([json.dumps(params, sort_keys=True)], dtype=np.object_)
                ),
                pb_utils.Tensor("ID", np.array([request.request_id()], dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# BLS: add_sub through pb_utils.InferenceRequest; INPUT0[0] == -1 asks for a model not there.
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


def out(response, name):
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            target = "nowhere" if float(a.as_numpy().flat[0]) == -1 else "add_sub"
            inner = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[a, b],
            ).exec()
            if inner.has_error():
                responses.append(pb_utils.InferenceResponse(error=inner.error()))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", out(inner, "OUTPUT0")),
                pb_utils.Tensor("DIFF", out(inner, "OUTPUT1")),
            ]))
        return responses
"""

BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1, 4 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 1, 4 ] }
]
"""

# Decoupled: one response per element of IN (OUT = the element), then the final flag alone.
REPEAT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for value in values:
                out = np.array([value], dtype=np.int32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Sequence: a running sum per correlation id, reset by the START control.
ACCUMULATE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0])
            key = request.correlation_id()
            total = value + (0 if start else self.sums.get(key, 0))
            self.sums[key] = total
            out = np.array([total], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""

ACCUMULATE_CONFIG = """
name: "accumulate"
backend: "python"
max_batch_size: 0
sequence_batching {
  max_sequence_idle_microseconds: 2000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

ENSEMBLE_CONFIG = """
name: "ensemble_add_sub"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" }
      output_map { key: "OUTPUT1" value: "DIFF" }
    },
    {
      model_name: "identity"
      model_version: -1
      input_map { key: "INPUT0" value: "sum" }
      output_map { key: "OUTPUT0" value: "SUM" }
    }
  ]
}
"""

# Custom metrics through pb_utils.MetricFamily: a counter, a gauge and a histogram.
METRICS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.counter_family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        labels = {"model": "custom_metrics", "version": "1"}
        self.counter = self.counter_family.Metric(labels=labels)
        self.gauge_family = pb_utils.MetricFamily(
            name="conformance_gauge",
            description="A gauge the conformance suite sets",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.gauge = self.gauge_family.Metric(labels={"model": "custom_metrics"})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.counter.increment(int(x[0]))
            self.gauge.set(float(x[0]))
            out = np.array([self.counter.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", out)]))
        return responses
"""

METRICS_CONFIG = """
name: "custom_metrics"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP64 dims: [ 1 ] } ]
"""

VERSIONED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = np.array([self.version], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("V", out)]) for _ in requests]
"""

VERSIONED_CONFIG = """
name: "versioned"
backend: "python"
max_batch_size: 0
version_policy: { latest: { num_versions: 2 } }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "V" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

INIT_FAILS_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize refuses")

    def execute(self, requests):
        return []
"""

SIMPLE_IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Configs Triton refuses (each model's folder also has a model.py that would serve).
BROKEN_CONFIGS = {
    "bad_datatype": 'backend: "python"\ninput [ { name: "X" data_type: TYPE_NOPE dims: [ 1 ] } ]\n',
    "dup_input": 'backend: "python"\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] }, '
    '{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    "neg_batch": 'backend: "python"\nmax_batch_size: -1\n' + SIMPLE_IO,
    "bad_dims": 'backend: "python"\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ -2 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    "wrong_name": 'name: "other_name"\nbackend: "python"\n' + SIMPLE_IO,
    "no_io": 'backend: "python"\n',
    "bad_dyn_batch": 'backend: "python"\nmax_batch_size: 0\ndynamic_batching { }\n' + SIMPLE_IO,
}

PASS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())
            ])
            for r in requests
        ]
"""

# name -> (config, model.py, versions)
MODELS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "all_types": (all_types_config(), ALL_TYPES_MODEL, (1,)),
    "add_sub": (ADD_SUB_CONFIG, ADD_SUB_MODEL, (1,)),
    "identity": (IDENTITY_CONFIG, IDENTITY_MODEL, (1,)),
    "errors": (ERRORS_CONFIG, ERRORS_MODEL, (1,)),
    "params": (PARAMS_CONFIG, PARAMS_MODEL, (1,)),
    "bls": (BLS_CONFIG, BLS_MODEL, (1,)),
    "repeat": (REPEAT_CONFIG, REPEAT_MODEL, (1,)),
    "accumulate": (ACCUMULATE_CONFIG, ACCUMULATE_MODEL, (1,)),
    "custom_metrics": (METRICS_CONFIG, METRICS_MODEL, (1,)),
    "versioned": (VERSIONED_CONFIG, VERSIONED_MODEL, (1, 2, 3)),
    "init_fails": ('backend: "python"\n' + SIMPLE_IO, INIT_FAILS_MODEL, (1,)),
    "spare": ('backend: "python"\n' + SIMPLE_IO, PASS_MODEL, (1,)),
    **{name: (config, PASS_MODEL, (1,)) for name, config in BROKEN_CONFIGS.items()},
}


def write_repository(repo: Path) -> Path:
    """Write every model of MODELS (and the ensemble) under `repo`; return `repo`."""
    for name, (config, code, versions) in MODELS.items():
        folder = repo / name
        folder.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config)
        for version in versions:
            (folder / str(version)).mkdir()
            (folder / str(version) / "model.py").write_text(code)
    (repo / "add_sub" / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    ensemble = repo / "ensemble_add_sub"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    return repo
