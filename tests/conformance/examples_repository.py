"""The models of Triton's Python-backend examples (python_backend's `examples/`), written anew.

Each model keeps its example's name, config (inputs, outputs, instance groups, decoupled policy)
and the `triton_python_backend_utils` calls it makes, so that a client written for the example
checks the same thing here. Examples that need libraries the agent does not ship (torch,
torchvision, jax, TensorRT, opencv) are left out, except where only a helper model used torch:
the `pytorch` model the BLS examples call is an add/sub model in numpy, and `instance_kind`
reports the instance arguments its resnet50 reads instead of running resnet50.
"""

from __future__ import annotations

from pathlib import Path

TWO_IN_TWO_OUT = """
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# examples/add_sub: the sum and difference, output types read from the config.
ADD_SUB_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [
            pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, name)["data_type"]
            )
            for name in ("OUTPUT0", "OUTPUT1")
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtypes[0])),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtypes[1])),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def finalize(self):
        print("add_sub finalized")
"""


def _add_sub_config(name: str, instances: str = "instance_group [{ kind: KIND_CPU }]") -> str:
    return f'name: "{name}"\nbackend: "python"\n{TWO_IN_TWO_OUT}{instances}\n'


# examples/auto_complete: no config.pbtxt; the model completes its own (inputs, outputs,
# max_batch_size, and dynamic batching for the batching one), reading what is there first.
AUTO_COMPLETE_MODEL = """
import triton_python_backend_utils as pb_utils

MAX_BATCH = {max_batch}
DYNAMIC = {dynamic}
INPUTS = [
    {{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}},
    {{"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}},
]
OUTPUTS = [
    {{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}},
    {{"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}},
]


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        present = auto_complete_model_config.as_dict()
        have_in = {{i["name"] for i in present["input"]}}
        have_out = {{o["name"] for o in present["output"]}}
        for spec in INPUTS:
            if spec["name"] not in have_in:
                auto_complete_model_config.add_input(spec)
        for spec in OUTPUTS:
            if spec["name"] not in have_out:
                auto_complete_model_config.add_output(spec)
        auto_complete_model_config.set_max_batch_size(MAX_BATCH)
        if DYNAMIC:
            auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
"""

# examples/bls, sync: MODEL_NAME (a BYTES element, as the client sends it) picks the model
# called; an error answered by that model is raised as TritonModelException.
BLS_SYNC_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            inner = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            answer = inner.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
"""

BLS_SYNC_CONFIG = (
    """
name: "bls_sync"
backend: "python"
input [ { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
    + TWO_IN_TWO_OUT
    + "instance_group [{ kind: KIND_CPU }]\n"
)

# examples/bls, async: `async def execute`, both models called at once (async_exec, gathered);
# OUTPUT0 from `pytorch`, OUTPUT1 from `add_sub`.
BLS_ASYNC_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            pending = [
                pb_utils.InferenceRequest(
                    model_name=name,
                    requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=inputs,
                ).async_exec()
                for name in ("pytorch", "add_sub")
            ]
            answers = await asyncio.gather(*pending)
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answers[0], "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answers[1], "OUTPUT1"),
            ]))
        return responses
"""

# The example's `pytorch` model is add/sub written with torch; the same in numpy.
PYTORCH_STANDIN_MODEL = ADD_SUB_MODEL

# examples/bls_decoupled: the sum of the responses a decoupled model streams back to BLS,
# once (exec(decoupled=True)) or twice at once (async_exec(decoupled=True), gathered). The sum
# starts as np.array([0]) (int64) although the config says INT32, as in the example.
BLS_DECOUPLED_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = {calls}


def _request(tensor):
    return pb_utils.InferenceRequest(
        model_name="square_int32", inputs=[tensor], requested_output_names=["OUT"]
    )


def _add(total, answers):
    for answer in answers:
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        if len(answer.output_tensors()) > 0:
            total += pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()


class TritonPythonModel:
    async def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException("one request at a time")
        tensor = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        total = np.array([0])
        if CALLS == 1:
            _add(total, _request(tensor).exec(decoupled=True))
        else:
            streams = await asyncio.gather(
                *[_request(tensor).async_exec(decoupled=True) for _ in range(CALLS)]
            )
            for answers in streams:
                _add(total, answers)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""


def _bls_decoupled_config(name: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [{ kind: KIND_CPU }]\n"
    )


# examples/decoupled, square_int32: IN = n answers n responses OUT = n from a thread started
# in execute, then the final flag; the config is checked in initialize.
SQUARE_MODEL = """
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(args["model_name"] + " must be decoupled")
        for spec in (
            pb_utils.get_input_config_by_name(config, "IN"),
            pb_utils.get_output_config_by_name(config, "OUT"),
        ):
            if spec["dims"] != [1] or spec["data_type"] != "TYPE_INT32":
                raise pb_utils.TritonModelException("unexpected " + spec["name"])
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            thread = threading.Thread(
                target=self.answer, args=(request.get_response_sender(), int(n[0])), daemon=True
            )
            self.threads.append(thread)
            thread.start()
        return None

    def answer(self, sender, n):
        for _ in range(n):
            out = pb_utils.Tensor("OUT", np.array([n], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

SQUARE_CONFIG = """
name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""

# examples/decoupled, repeat_int32: one response (IDX, OUT) per element of IN, each after its
# DELAY in ms, from a thread; execute itself returns after WAIT ms. A config parameter
# `output_num_elements` sizes OUT.
REPEAT_MODEL = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(args["model_name"] + " must be decoupled")
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUT")["data_type"]
        )
        self.idx_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "IDX")["data_type"]
        )
        size = config.get("parameters", {}).get("output_num_elements", {})
        self.size = int(size.get("string_value", 1))
        self.threads = []

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException("one request at a time")
        values = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(requests[0], "DELAY").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(
                f"IN and DELAY differ in shape: {list(values.shape)} and {list(delays.shape)}."
            )
        thread = threading.Thread(
            target=self.answer,
            args=(requests[0].get_response_sender(), values, delays),
            daemon=True,
        )
        self.threads.append(thread)
        thread.start()
        wait = pb_utils.get_input_tensor_by_name(requests[0], "WAIT").as_numpy()
        time.sleep(wait[0] / 1000)
        return None

    def answer(self, sender, values, delays):
        for idx in range(values.size):
            time.sleep(delays[idx] / 1000)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("IDX", np.array([idx], self.idx_dtype)),
                pb_utils.Tensor("OUT", np.full((self.size,), values[idx], dtype=self.out_dtype)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

REPEAT_CONFIG = """
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

# examples/custom_metrics: add/sub on three instances; a counter family with the example's
# name, help and labels, incremented by each execute's time, logged through pb_utils.Logger.
CUSTOM_METRICS_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metric = self.family.Metric(labels={"model": "custom_metrics", "version": "1"})

    def execute(self, requests):
        start = time.time_ns()
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        self.metric.increment(time.time_ns() - start)
        pb_utils.Logger.log_info("latency so far: {}".format(self.metric.value()))
        return responses
"""

# examples/instance_kind without resnet50: what initialize reads from `args` to place the model
# (kind, device id) comes back. (The example builds its output with Tensor.from_dlpack from a
# torch tensor; Triton 2.51's stub crashes on a numpy array's DLPack capsule, so plain Tensor.)
INSTANCE_KIND_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        device = "cuda" if args["model_instance_kind"] == "GPU" else "cpu"
        self.device = device + ":" + args["model_instance_device_id"]

    def execute(self, requests):
        responses = []
        for request in requests:
            batch = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            scores = batch.sum(axis=(2, 3))
            where = np.array([[self.device]] * batch.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", scores),
                pb_utils.Tensor("DEVICE", where),
            ]))
        return responses
"""

INSTANCE_KIND_CONFIG = """
name: "resnet50"
backend: "python"
max_batch_size: 128
input { name: "INPUT" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 4, 4 ] }
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "DEVICE" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

# examples/bls_error_code: error_source answers a TritonError with the code it is sent;
# bls_error_caller calls it by BLS and answers the code and message its response carried.
ERROR_SOURCE_MODEL = """
import triton_python_backend_utils as pb_utils

NAMES = [
    "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
    "ALREADY_EXISTS", "CANCELLED",
]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            sent = int(pb_utils.get_input_tensor_by_name(request, "ERROR_CODE").as_numpy()[0])
            name = NAMES[sent] if 0 <= sent < len(NAMES) else "INTERNAL"
            error = pb_utils.TritonError(
                "Test error with code " + str(sent), getattr(pb_utils.TritonError, name)
            )
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
"""

ERROR_CALLER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            sent = pb_utils.get_input_tensor_by_name(request, "ERROR_CODE").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="error_source",
                requested_output_names=["OUTPUT"],
                inputs=[pb_utils.Tensor("ERROR_CODE", sent)],
            ).exec()
            if answer.has_error():
                code, text = int(answer.error().code()), str(answer.error().message())
            else:
                code, text = -1, "no error"
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("RECEIVED_CODE", np.array([code], dtype=np.int32)),
                pb_utils.Tensor("ERROR_MESSAGE", np.array([text], dtype=object)),
            ]))
        return responses
"""

ERROR_SOURCE_CONFIG = """
name: "error_source"
backend: "python"
max_batch_size: 0
input [ { name: "ERROR_CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""

ERROR_CALLER_CONFIG = """
name: "bls_error_caller"
backend: "python"
max_batch_size: 0
input [ { name: "ERROR_CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "RECEIVED_CODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ERROR_MESSAGE" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

# name -> (config or None for none at all, model.py)
MODELS: dict[str, tuple[str | None, str]] = {
    "add_sub": (_add_sub_config("add_sub"), ADD_SUB_MODEL),
    "pytorch": (_add_sub_config("pytorch"), PYTORCH_STANDIN_MODEL),
    "nobatch_auto_complete": (None, AUTO_COMPLETE_MODEL.format(max_batch=0, dynamic=False)),
    "batch_auto_complete": (None, AUTO_COMPLETE_MODEL.format(max_batch=4, dynamic=True)),
    "bls_sync": (BLS_SYNC_CONFIG, BLS_SYNC_MODEL),
    "bls_async": (_add_sub_config("bls_async"), BLS_ASYNC_MODEL),
    "bls_decoupled_sync": (
        _bls_decoupled_config("bls_decoupled_sync"),
        BLS_DECOUPLED_MODEL.format(calls=1),
    ),
    "bls_decoupled_async": (
        _bls_decoupled_config("bls_decoupled_async"),
        BLS_DECOUPLED_MODEL.format(calls=2),
    ),
    "square_int32": (SQUARE_CONFIG, SQUARE_MODEL),
    "repeat_int32": (REPEAT_CONFIG, REPEAT_MODEL),
    "custom_metrics": (
        _add_sub_config("custom_metrics", "instance_group [ { count: 3 kind: KIND_CPU } ]"),
        CUSTOM_METRICS_MODEL,
    ),
    "resnet50": (INSTANCE_KIND_CONFIG, INSTANCE_KIND_MODEL),
    "error_source": (ERROR_SOURCE_CONFIG, ERROR_SOURCE_MODEL),
    "bls_error_caller": (ERROR_CALLER_CONFIG, ERROR_CALLER_MODEL),
}


def write_examples(repo: Path) -> Path:
    """Write every model of MODELS (version 1) under `repo`; return `repo`."""
    for name, (config, code) in MODELS.items():
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        if config is not None:
            (folder / "config.pbtxt").write_text(config)
        (folder / "1" / "model.py").write_text(code)
    return repo
