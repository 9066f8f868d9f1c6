"""A decoupled Python model (`model_transaction_policy { decoupled: true }`) for the tests.

Inputs (each [1], batched): N, MODE, ERROR_AT (INT32). Output OUT (INT32 [1]): the index of
each response. MODE:

* 0: a thread per request sends N responses, then the final flag alone (after `execute`
  returned: Triton lets a model answer from any thread);
* 1: `execute` itself sends N responses per request, the last one with the final flag;
* 2: streams until the request is cancelled, then writes `cancelled-<value of N>` into the
  folder named by the config parameter `marker_dir` (the test waits for that file);
* 3: `execute` returns a list of responses (Triton answers each request with an error);
* 4: `execute` raises.

ERROR_AT >= 0: that response is an error response (and the stream goes on).
"""

from __future__ import annotations

from pathlib import Path

DECOUPLED_MODEL = """
import json
import os
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker_dir = config["parameters"]["marker_dir"]["string_value"]

    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy().flat[0])
        if mode == 3:
            return [pb_utils.InferenceResponse([]) for _ in requests]
        if mode == 4:
            raise pb_utils.TritonModelException("execute gave up")
        for request in requests:
            if int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().flat[0]) == 1:
                self._stream(request, final_with_last=True)
            else:
                threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request, final_with_last=False):
        sender = request.get_response_sender()
        n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().flat[0])
        mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().flat[0])
        error_at = int(pb_utils.get_input_tensor_by_name(request, "ERROR_AT").as_numpy().flat[0])
        if mode == 2:
            i = 0
            while not request.is_cancelled():
                sender.send(self._response(i))
                i += 1
                time.sleep(0.01)
            path = os.path.join(self.marker_dir, f"cancelled-{n}")
            with open(path + ".tmp", "w") as f:
                f.write(str(i))
            os.replace(path + ".tmp", path)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i in range(n):
            if i == error_at:
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"response {i} failed")
                )
            else:
                response = self._response(i)
            last = final_with_last and i == n - 1
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
            sender.send(response, flags=flags)
        if not (final_with_last and n > 0):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException as exc:
            assert "Response sender has been closed" in str(exc)
        else:
            raise AssertionError("a send after the final flag must fail")

    @staticmethod
    def _response(i):
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[i]], np.int32))])
"""


def decoupled_config(name: str, marker_dir: Path, *, instances: int = 1) -> str:
    inputs = ", ".join(
        f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 1 ] }}' for n in ("N", "MODE", "ERROR_AT")
    )
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {inputs} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "marker_dir" value {{ string_value: "{marker_dir}" }} }}
"""
