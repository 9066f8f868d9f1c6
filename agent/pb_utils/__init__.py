"""Helpers for Python models (`backend: "python"`): Triton's `triton_python_backend_utils`.

A model's `model.py` imports this module as Triton's Python backend names it
(`import triton_python_backend_utils as pb_utils`; `from agent import pb_utils` is the same
module) and defines::

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config): ...  # optional; a ModelConfig
        def initialize(self, args): ...          # optional; args: dict of str → str
        def execute(self, requests): ...         # list[InferenceRequest] → list[InferenceResponse]
        def finalize(self): ...                  # optional; runs on unload

`args` holds the keys Triton's Python backend passes: model_config (the completed config as a
JSON string), model_instance_kind ("CPU"/"GPU"), model_instance_name, model_instance_device_id,
model_repository (the model's folder), model_version and model_name.

As in Triton, the requests of a dynamic batch reach `execute` together, each its own
`InferenceRequest` (not merged), and `execute` returns one response per request, in order.
`request_id()` is empty.

Decoupled models (`model_transaction_policy { decoupled: true }`) answer through each request's
`get_response_sender()` instead: `send(response)` any number of times, then
`send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` (with or without a last response); `execute`
returns None, and the sender may be used from another thread after `execute` returned.
`request.is_cancelled()` turns true when the client went away.

This module is imported inside the worker process; it needs only numpy. It is the public face:
the implementations live in one module per concept in this package (`errors`, `logger`,
`tensor`, `request`, `response`, `model_config`, `convert`, `metrics`), re-exported here,
where a model finds them as `pb_utils.X`; `__all__` lists them.
"""

from __future__ import annotations

from agent.pb_utils.convert import (
    deserialize_bytes_tensor,
    numpy_to_kserve,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from agent.pb_utils.errors import ModelError, TritonError, TritonModelException
from agent.pb_utils.logger import Logger, LogLevel, LogSink, set_log_sink
from agent.pb_utils.metrics import Metric, MetricFamily, MetricKind
from agent.pb_utils.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from agent.pb_utils.request import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    BlsRunner,
    InferenceRequest,
    InferenceTrace,
    get_input_tensor_by_name,
    set_bls_runner,
)
from agent.pb_utils.response import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
    InferenceResponseSender,
    get_output_tensor_by_name,
)
from agent.pb_utils.tensor import Tensor

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "BlsRunner",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "LogSink",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "ModelError",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_kserve",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "set_bls_runner",
    "set_log_sink",
    "set_model_dir",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

_model_dir = ""


def get_model_dir() -> str:
    """The folder of the model's file (its version folder), as Triton's `get_model_dir`."""
    return _model_dir


def set_model_dir(path: str) -> None:
    """Set what `get_model_dir` answers (the worker calls this before importing the model)."""
    global _model_dir  # noqa: PLW0603 - one model per worker process
    _model_dir = path
