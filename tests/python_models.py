"""Python models (`backend: "python"`) the tests write into a repository."""

from __future__ import annotations

from pathlib import Path

from tests.models import IDENTITY_TYPES

# X FP32 → Y = 2X and PID (the worker's pid). The first value of X picks a misbehaviour.
BEHAVIOUR_MODEL = """
import json
import os
import signal
import time

import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"].get("marker", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            first = float(x.flat[0])
            if first == 3:
                os._exit(3)
            if first == 9:
                os.kill(os.getpid(), signal.SIGKILL)
            if first == 7:
                time.sleep(3600)
            if first < 0:
                raise ValueError("negative input")
            if first == 1:
                error = pb_utils.TritonError("one is not allowed")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            pid = np.full(x.shape, os.getpid(), dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("PID", pid)]
                )
            )
        return responses

    def finalize(self):
        if self.marker:
            with open(self.marker, "a") as f:
                f.write(f"finalized {os.getpid()}\\n")
"""


def behaviour_config(name: str, *, timeout_s: int | None = None, marker: Path | None = None) -> str:
    params = ""
    if timeout_s is not None:
        params += (
            'parameters { key: "execute_timeout_seconds" '
            f'value {{ string_value: "{timeout_s}" }} }}\n'
        )
    if marker is not None:
        params += f'parameters {{ key: "marker" value {{ string_value: "{marker}" }} }}\n'
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [
  {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }}
]
{params}"""


ADD_SUB_MODEL = """
from agent import pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                )
            )
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
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""

# Every input IN_<TYPE> comes back as OUT_<TYPE>.
ECHO_MODEL = """
from agent import pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT_" + t.name()[3:], t.as_numpy()) for t in request.inputs()]
            )
            for request in requests
        ]
"""


def echo_config() -> str:
    config_types = {k: f"TYPE_{'STRING' if k == 'BYTES' else k}" for k in IDENTITY_TYPES}
    inputs = ",\n".join(
        f'  {{ name: "IN_{k}" data_type: {t} dims: [ 3 ] }}' for k, t in config_types.items()
    )
    outputs = ",\n".join(
        f'  {{ name: "OUT_{k}" data_type: {t} dims: [ 3 ] }}' for k, t in config_types.items()
    )
    return f"""
name: "echo_all"
backend: "python"
max_batch_size: 4
input [
{inputs}
]
output [
{outputs}
]
"""


# Answers its initialize args as JSON. Each request waits (bounded) until as many workers as the
# request's X says are inside execute at once, so concurrent requests prove distinct workers.
ARGS_MODEL = """
import json
import os
import time

import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.meeting = config["parameters"]["meeting"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            open(os.path.join(self.meeting, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 20
            while len(os.listdir(self.meeting)) < wanted and time.monotonic() < deadline:
                time.sleep(0.01)
            met = len(os.listdir(self.meeting))
            text = np.array([json.dumps(self.args).encode()], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("ARGS", text),
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                        pb_utils.Tensor("MET", np.array([met], dtype=np.int64)),
                    ]
                )
            )
        return responses
"""


def args_config(meeting: Path) -> str:
    return f"""
name: "args"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "MET" data_type: TYPE_INT64 dims: [ 1 ] }}
]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters {{ key: "meeting" value {{ string_value: "{meeting}" }} }}
"""


BAD_INIT_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights here")

    def execute(self, requests):
        return []
"""

NO_CLASS_MODEL = """
class SomethingElse:
    pass
"""


def minimal_config(name: str, *, with_inputs: bool = True) -> str:
    inputs = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]' if with_inputs else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
{inputs}
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def write_python_model(repo: Path, name: str, source: str, config: str, version: int = 1) -> Path:
    model_dir = repo / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / str(version) / "model.py").write_text(source)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


# Returns Y as float64 while the config says FP32, and a Y of the wrong length when X[0] == 5.
SLOPPY_MODEL = """
import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        y = x[:1] if x.flat[0] == 5 else x.astype(np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)])]
"""


# finalize never returns: unloading must still end the worker (finalize_timeout_seconds).
STUCK_FINALIZE_MODEL = (
    ADD_SUB_MODEL
    + """
    def finalize(self):
        import time

        while True:
            time.sleep(1)
"""
)


# Written as Triton users write them: Triton's module name, its exception, its logger and
# auto_complete_config; their config.pbtxt names no backend (model.py makes them Python models).
def triton_auto_model(max_batch_size: int) -> str:
    dims = "[4]"
    return f"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": {dims}}},
                  {{"name": "INPUT1", "data_type": "TYPE_FP32", "dims": {dims}}}]
        outputs = [{{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": {dims}}},
                   {{"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": {dims}}}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for i in inputs:
            if i["name"] not in input_names:
                auto_complete_model_config.add_input(i)
        for o in outputs:
            if o["name"] not in output_names:
                auto_complete_model_config.add_output(o)
        auto_complete_model_config.set_max_batch_size({max_batch_size})
        if {max_batch_size} > 0:
            auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.args = dict(args)
        pb_utils.Logger.log_info(f"initialized {{args['model_name']}} on "
                                 f"{{args['model_instance_kind']}}")
        pb_utils.Logger.log("via log() " + pb_utils.get_model_dir(), pb_utils.LogLevel.WARNING)

    def execute(self, requests):
        logger = pb_utils.Logger
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if (in_0 < 0).any():
                logger.log_error("negative INPUT0")
                raise pb_utils.TritonModelException("INPUT0 must not be negative")
            logger.log_warn(f"execute {{in_0.shape}}")
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(np.float32))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("Cleaning up...")
"""


# auto_complete_config that contradicts config.pbtxt: Triton refuses it with a ValueError.
CLASHING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}
        )
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""

RETURNS_NOTHING_MODEL = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(2)

    def execute(self, requests):
        return []
"""


# Answers each request of an execute call with its own X doubled and how many requests the call
# held; a request whose X is negative gets an error response (the others of its call do not).
REQUEST_COUNT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative X")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            count = np.full((x.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("COUNT", count)]
                )
            )
        return responses
"""

REQUEST_COUNT_CONFIG = """
max_batch_size: 16
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 300000 preferred_batch_size: [ 16 ] }
"""
