"""Helpers for Python models (`backend: "python"`), in the style of Triton's Python backend.

A model's `model.py` imports this module (`from agent import pb_utils`) and defines::

    class TritonPythonModel:
        def initialize(self, args): ...          # optional; args: dict of str → str
        def execute(self, requests): ...         # list[InferenceRequest] → list[InferenceResponse]
        def finalize(self): ...                  # optional; runs on unload

`args` holds the keys Triton's Python backend passes: model_config (the completed config as a
JSON string), model_instance_kind ("CPU"/"GPU"), model_instance_name, model_instance_device_id,
model_repository (the model's folder), model_version and model_name.

The agent merges a dynamic batch into one feed before it reaches the backend, so `execute`
receives ONE request holding the whole batch (first dimension = rows) and must return one
response. `request_id()` is therefore empty.

This module is imported inside the worker process; it needs only numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agent.tensors import datatypes


class ModelError(Exception):
    """An error a model reports for a request (Triton's `TritonError`).

    Put it in `InferenceResponse(error=...)`, or raise it from `execute`.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self._message = message
        self.code = code

    def message(self) -> str:
        return self._message


TritonError = ModelError


class Tensor:
    """A named tensor holding a numpy array (object arrays of bytes for BYTES)."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"Tensor '{name}' needs a numpy array, got {type(data).__name__}")
        self._name = name
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def triton_dtype(self) -> str:
        """The KServe datatype of the array ("FP32", "BYTES", ...)."""
        return numpy_to_kserve(self._data.dtype)


class InferenceRequest:
    """One request as `execute` sees it: its inputs and the outputs the client asked for."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        request_id: str = "",
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._id = request_id

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._id


class InferenceResponse:
    """The answer to one request: output tensors, or an error."""

    def __init__(
        self, output_tensors: Sequence[Tensor] | None = None, error: ModelError | None = None
    ) -> None:
        self._outputs = list(output_tensors or ())
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> ModelError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called `name`, or None."""
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called `name`, or None."""
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `input` entry called `name` of a model config (as `json.loads(args["model_config"])`)."""
    return _entry(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `output` entry called `name` of a model config, or None."""
    return _entry(model_config, "output", name)


def triton_string_to_numpy(type_string: str) -> type[Any]:
    """The numpy type for a config data type ("TYPE_FP32" → np.float32, TYPE_STRING → object).

    Raises:
        ValueError: not a data type the agent serves.
    """
    found = datatypes.from_config(type_string)
    if found is None:
        raise ValueError(f"unsupported data type {type_string!r}")
    return found.numpy.type


def numpy_to_kserve(dtype: np.dtype) -> str:
    """The KServe datatype of a numpy dtype; str and bytes arrays are BYTES.

    Raises:
        ValueError: a dtype no KServe datatype holds.
    """
    if dtype.kind in "OSU":
        return "BYTES"
    for kind in datatypes.BY_KSERVE.values():
        if kind.numpy == dtype:
            return kind.kserve
    raise ValueError(f"numpy dtype {dtype} has no KServe datatype")


def _entry(model_config: Mapping[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(key, ()):
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None
