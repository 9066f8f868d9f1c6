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

This module is imported inside the worker process; it needs only numpy.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar

import numpy as np

from agent.tensors import datatypes


class ModelError(Exception):
    """An error a model reports for a request (Triton's `TritonError`).

    Put it in `InferenceResponse(error=...)`, or raise it from `execute`.
    """

    # Triton's error codes (`pb_utils.TritonError.CANCELLED` ...); the default is INTERNAL.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self._message = message
        self._code = self.INTERNAL if code is None else int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


TritonError = ModelError


class TritonModelException(ModelError):
    """Triton's exception for a model's failure: raise it from any `TritonPythonModel` method."""


class LogLevel(enum.IntEnum):
    """Levels of `Logger.log` (Triton's `pb_utils.Logger.LogLevel`)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


# Where Logger lines go: (level, message, file, line). The worker sends them to the agent's log;
# elsewhere (a model imported in a test) they go to stderr.
LogSink = Callable[[LogLevel, str, str, int], None]


def _stderr_sink(level: LogLevel, message: str, filename: str, line: int) -> None:
    print(f"{level.name[0]} {os.path.basename(filename)}:{line}] {message}", file=sys.stderr)


_log_sink: LogSink = _stderr_sink


def set_log_sink(sink: LogSink | None) -> None:
    """Send `Logger` lines to `sink` (None: back to stderr). The worker calls this."""
    global _log_sink  # noqa: PLW0603 - one sink per process, as Triton's stub has one logger
    _log_sink = sink or _stderr_sink


_Level = LogLevel  # Logger.LogLevel is the same enum (a class attribute of that name)


class Logger:
    """Triton's `pb_utils.Logger`: lines in the agent's log, tagged with the model's name."""

    LogLevel: ClassVar[type[_Level]] = _Level
    INFO: ClassVar[_Level] = _Level.INFO
    WARNING: ClassVar[_Level] = _Level.WARNING
    ERROR: ClassVar[_Level] = _Level.ERROR
    VERBOSE: ClassVar[_Level] = _Level.VERBOSE

    @staticmethod
    def log(message: str, level: _Level = _Level.INFO) -> None:
        Logger._emit(message, _Level(level))

    @staticmethod
    def log_info(message: str) -> None:
        Logger._emit(message, _Level.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger._emit(message, _Level.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger._emit(message, _Level.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger._emit(message, _Level.VERBOSE)

    @staticmethod
    def _emit(message: str, level: _Level) -> None:
        # The caller of log/log_info/...: two frames up from here, as Triton reports file:line.
        frame = inspect.currentframe()
        caller = frame.f_back.f_back if frame and frame.f_back else None
        filename, line = (caller.f_code.co_filename, caller.f_lineno) if caller else ("", 0)
        _log_sink(level, str(message), filename, line)


_model_dir = ""


def get_model_dir() -> str:
    """The folder of the model's file (its version folder), as Triton's `get_model_dir`."""
    return _model_dir


def set_model_dir(path: str) -> None:
    """Set what `get_model_dir` answers (the worker calls this before importing the model)."""
    global _model_dir  # noqa: PLW0603 - one model per worker process
    _model_dir = path


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


# Response flags (Triton's TRITONSERVER_ResponseCompleteFlag).
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
# Request flags (Triton's TRITONSERVER_RequestFlag): a BLS request's `flags=`, with its
# `correlation_id=`, make it a request of that sequence.
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model (`get_response_sender()`).

    The transport (set by the worker) gets each checked response with its final flag; the
    checks and their wording are Triton's Python backend's.
    """

    def __init__(
        self,
        transport: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
        *,
        decoupled: bool = True,
    ) -> None:
        self._transport = transport
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send a response, and/or with TRITONSERVER_RESPONSE_COMPLETE_FINAL end the request.

        Raises:
            TritonModelException: a bad flag, no response without the final flag, or the
                sender was closed by an earlier final flag.
        """
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Unable to send response. Expected an InferenceResponse, got "
                f"{type(response).__name__}."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled and response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if not self._decoupled and response is None and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if final:
                self._closed = True
            self._sent += 1
            self._transport(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def is_closed(self) -> bool:
        with self._lock:
            return self._closed


class InferenceTrace:
    """A request's trace, as `request.trace()` returns it inside `execute`.

    Pass it to a BLS request (`InferenceRequest(..., trace=request.trace())`) to have that
    request traced as a child of this one when this one is traced (Triton's tracing for BLS).
    """

    def __init__(self, index: int | None = None) -> None:
        self.index = index  # which request of the execute call; None: not traced

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The OpenTelemetry context Triton would hand over; this agent keeps it agent-side."""
        return None


class InferenceRequest:
    """A request: as `execute` receives it, or built by the model for BLS and run with `exec`.

    For BLS (Triton's business logic scripting), inside `execute`::

        request = pb_utils.InferenceRequest(
            model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[tensor, ...],
            model_version=-1, timeout=0, parameters={"key": "value"})
        response = request.exec()             # or: await request.async_exec()

    `model_version` -1 is the version the model's policy serves (a canary may route it);
    `timeout` is in microseconds (0: none); `parameters` values are bool, int or str. The call
    runs through the agent's own data plane; a failure (an unknown model included) comes back
    as a response whose `error()` says why.
    """

    def __init__(
        self,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        request_id: str = "",
        *,
        model_name: str | bytes = "",
        model_version: int = -1,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = [str(n) for n in requested_output_names]
        self._id = request_id
        # Triton models often pass a BYTES element (`as_numpy()[0]`) as the model name.
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = int(model_version)
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        self._flags = int(flags)
        if int(timeout) < 0:
            raise TritonModelException("timeout must be a non-negative number of microseconds")
        self._timeout = int(timeout)
        self._cancelled = False
        self._parameters = dict(parameters or {})
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()
        for key, value in self._parameters.items():
            if not isinstance(key, str):
                raise TritonModelException(
                    f"Expect parameters keys to have type str, found type {type(key)}"
                )
            if not isinstance(value, bool | int | str):
                raise TritonModelException(
                    f"Expect parameters values to have type bool/int/str, found type {type(value)}"
                )

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def get_response_sender(self) -> InferenceResponseSender:
        """This request's response sender (decoupled models).

        A model that is not decoupled may answer through it too (one response, inside
        `execute`, which then returns None), as Triton allows.

        Raises:
            TritonModelException: the request was built by the model (BLS).
        """
        sender: InferenceResponseSender | None = getattr(self, "_sender", None)
        if sender is None:
            raise TritonModelException(
                "get_response_sender() is only available on the requests `execute` receives"
            )
        return sender

    def set_response_sender(self, sender: InferenceResponseSender) -> None:
        """Attach the sender (the worker does this for decoupled models; not Triton's API)."""
        self._sender = sender

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._id

    def trace(self) -> InferenceTrace:
        """This request's trace: pass it as `trace=` to a BLS request to trace that as a child."""
        return self._trace

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The parameters as a JSON string (as Triton returns them)."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled: its client went away, or the BLS call that made
        it was cancelled (as Triton's; a model may stop early and answer an error response)."""
        return self._cancelled

    def set_cancelled(self) -> None:
        """Mark the request cancelled (the worker does, when the agent says so)."""
        self._cancelled = True

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` and wait for its response (BLS).

        `decoupled=True` (needed for a decoupled model, allowed for any): an iterator of its
        responses, the last one with the final flag (an empty response when the model sent
        the flag alone); it is returned once the first response came.

        Raises:
            TritonModelException: called outside `execute` (of a model that is not decoupled).
        """
        return self._submit(decoupled).result()

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Run this request on `model_name`: `await request.async_exec()` (BLS).

        `decoupled=True`: the awaitable gives the responses' iterator (`for` or `async for`).
        Cancelling the awaiting task (`task.cancel()`, `asyncio.wait_for` timing out) cancels
        the child request in the agent too. Must be called from the running event loop of an
        `async def execute`.

        Raises:
            TritonModelException: called outside `execute` (of a model that is not decoupled).
        """
        import asyncio  # noqa: PLC0415 - only models with async execute need it

        return asyncio.wrap_future(self._submit(decoupled))

    def _submit(self, decoupled: bool) -> Future[Any]:
        if _bls_runner is None:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        return _bls_runner(self, bool(decoupled))


# Starts a BLS request (decoupled or not), its response (or iterator) to come in the future:
# set by the worker while `execute` runs (for a decoupled model: from then on), None otherwise.
BlsRunner = Callable[[InferenceRequest, bool], "Future[Any]"]
_bls_runner: BlsRunner | None = None


def set_bls_runner(runner: BlsRunner | None) -> None:
    """Let `InferenceRequest.exec` run requests (the worker sets it around `execute`)."""
    global _bls_runner  # noqa: PLW0603 - one model per worker process
    _bls_runner = runner


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


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config's `model_transaction_policy` is decoupled."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """The config `auto_complete_config` receives and returns (Triton's `pb_utils.ModelConfig`).

    `as_dict()` is the config as JSON (the config endpoint's form, `max_batch_size`, `input` and
    `output` always present). Only max_batch_size, inputs, outputs, the dynamic batcher and the
    transaction policy can be changed; each setter refuses, with `ValueError` worded as Triton's,
    a change that contradicts what config.pbtxt says.
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)
        self._model_config.setdefault("max_batch_size", 0)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises ValueError: config.pbtxt sets a larger max_batch_size."""
        current = int(self._model_config["max_batch_size"])
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Raises ValueError: the config already uses another scheduler."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Raises ValueError: unknown or missing properties, or a clash with config.pbtxt."""
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Raises ValueError: unknown or missing properties, or a clash with config.pbtxt."""
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Raises ValueError: a key other than 'decoupled', or a different decoupled value."""
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict[str, Any], allowed: Sequence[str]) -> None:
        where = f"in auto-complete-config function for model '{self._name}'"
        if any(key not in allowed for key in tensor):
            names = ", ".join(f"'{k}'" for k in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(
                f"{kind} '{tensor.get('name', '')}' {where} contains property other than {names}."
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        name = tensor["name"]
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{key}' property.")
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            declared_type = current.get("data_type", "TYPE_INVALID")
            if declared_type != "TYPE_INVALID" and declared_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{declared_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            declared_dims = [int(d) for d in current.get("dims", [])]
            if declared_dims and declared_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{declared_dims}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))


# Custom metrics (Triton's MetricFamily / Metric) and Triton's BYTES and type-code helpers live
# in their own modules; pb_metrics needs the exceptions above: imported last on purpose.
# (`X as X`: re-exported names, for type checkers.)
from agent.pb_convert import deserialize_bytes_tensor as deserialize_bytes_tensor  # noqa: E402, PLC0414
from agent.pb_convert import numpy_to_triton_type as numpy_to_triton_type  # noqa: E402, PLC0414
from agent.pb_convert import serialize_byte_tensor as serialize_byte_tensor  # noqa: E402, PLC0414
from agent.pb_convert import triton_to_numpy_type as triton_to_numpy_type  # noqa: E402, PLC0414
from agent.pb_metrics import Metric as Metric  # noqa: E402, PLC0414
from agent.pb_metrics import MetricFamily as MetricFamily  # noqa: E402, PLC0414
from agent.pb_metrics import MetricKind as MetricKind  # noqa: E402, PLC0414
