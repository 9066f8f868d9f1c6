"""The wire between the agent and a Python model's worker process.

One message is a small JSON header, then one raw buffer per tensor, each sent with
`Connection.send_bytes`::

    header  {"kind": "execute", "meta": {...}, "tensors": [{"name", "datatype", "shape",
             "nbytes"}, ...]}
    buffer  tensor 0: row-major little-endian bytes; BYTES tensors in KServe's encoding
            (4-byte little-endian length before each element)
    buffer  tensor 1 ...

Tensor data never goes through JSON. Buffers are received into fresh writable arrays.

Why pipes and not shared memory: a worker can be killed at any moment (hang timeout, crash,
`kill -9` of the agent). A socketpair disappears with its last holder, while a shared-memory
segment in /dev/shm outlives a process killed before it unlinks it. The price is one copy per
tensor each way, small next to the cost of Python pre/post-processing.

Flow control: a socket buffer holds far less than one tensor, so a writer blocks until the other
side reads. The worker reads its end on a thread of its own at all times (`python_mailbox`), so
a write from the agent never waits on user code, and both sides can never be stuck writing at
once (an abandoned BLS result of many MB while the worker sends its own answer, say).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from agent.pb_utils import numpy_to_kserve
from agent.tensors import datatypes
from agent.tensors.request import tensor_from_bytes, tensor_to_bytes

# Message kinds.
INIT = "init"  # agent → worker: meta {"model_file", "args"}
READY = "ready"  # worker → agent, after initialize
EXECUTE = "execute"  # agent → worker: meta {"outputs": [...]}, tensors: the inputs
RESULT = "result"  # worker → agent, tensors: the outputs
ERROR = "error"  # worker → agent: meta {"message"}
FINALIZE = "finalize"  # agent → worker
FINALIZED = "finalized"  # worker → agent, then it exits
AUTOCOMPLETE = "autocomplete"  # agent → worker: meta {"model_file", "config", "model_name"}
COMPLETED = "completed"  # worker → agent: meta {"config"}: the completed config as JSON
LOG = "log"  # worker → agent at any time: meta {"level", "message", "file", "line"}
# worker → agent before any other message it sends, when custom metrics changed:
# meta {"families": [...], "metrics": [...]} (see agent.pb_utils.metrics.take_updates)
METRICS = "metrics"
# BLS (agent.backends.python.bls): worker → agent inside `execute`, meta {"id", "model",
# "version", "outputs", "timeout_us", "parameters", "request_id"}, tensors: the inputs; the agent
# answers each with BLS_RESULT, meta {"id"} and the outputs, or {"id", "error"}.
BLS = "bls"
BLS_RESULT = "bls_result"
# A BLS_RESULT error for a call whose request was cancelled (Triton's message; both sides use it).
CANCELLED = "Request was cancelled"
# worker → agent: meta {"id"}: the model dropped that BLS call (its asyncio task was cancelled);
# the agent cancels the child request and sends no result.
BLS_CANCEL = "bls_cancel"
# agent → worker inside `execute`: meta {"requests": [index, ...]}: those requests of the batch
# were cancelled (the client went away, or the BLS call that made them was cancelled);
# `InferenceRequest.is_cancelled()` then answers True. For a decoupled model, meta {"id"}: that
# request (see RESPONSE), at any time until its final flag.
CANCEL = "cancel"
# worker → agent: meta {"id", "family", "labels"}: the agent's total of one custom metric (every
# instance's share); the agent answers METRIC_VALUE_RESULT meta {"id", "value"} (None: unknown).
METRIC_VALUE = "metric_value"
METRIC_VALUE_RESULT = "metric_value_result"
# Decoupled models (agent.backends.python.stream): EXECUTE's requests carry an "id" each; the
# worker sends RESPONSE meta {"id", "final", "error"?}, tensors: the outputs, at any time (from
# any thread, during or after `execute`), and RESULT meta {"responses": []} when `execute`
# returned.
RESPONSE = "response"
# Liveness (agent.backends.python.supervisor): agent → worker PING meta {"n"} at any time after
# READY; the worker's pipe reader hands it to a thread of its own that answers PONG meta {"n"}
# (the reader itself never writes: see the flow control above). A PONG may come late, after
# the `execute` it overlapped: the numbers say which PING it answers.
PING = "ping"
PONG = "pong"

MAX_HEADER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Message:
    """One message: its kind, small JSON-able fields and named tensors."""

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: list[tuple[str, np.ndarray]] = field(default_factory=list)


class WireError(Exception):
    """A malformed message (a bug on one side, not a user error)."""


def send(conn: Connection, message: Message) -> None:
    """Send a message (blocking). Raises OSError when the other side is gone."""
    described = []
    buffers: list[bytes | memoryview] = []
    for name, array in message.tensors:
        kind = numpy_to_kserve(array.dtype)
        raw: bytes | memoryview
        if kind == "BYTES":
            raw = tensor_to_bytes(array, kind)
            nbytes = len(raw)
        else:  # the array's own memory goes to the socket: no intermediate copy
            raw = np.ascontiguousarray(array).reshape(-1).data.cast("B")
            nbytes = raw.nbytes
        described.append(
            {"name": name, "datatype": kind, "shape": list(array.shape), "nbytes": nbytes}
        )
        buffers.append(raw)
    header = {"kind": message.kind, "meta": message.meta, "tensors": described}
    conn.send_bytes(json.dumps(header, separators=(",", ":")).encode())
    for raw in buffers:
        conn.send_bytes(raw)


def receive(conn: Connection, deadline: float | None = None) -> Message:
    """Receive one message; `deadline` is a `time.monotonic()` instant, None waits for ever.

    Raises:
        TimeoutError: the deadline passed before the whole message arrived.
        EOFError: the other side closed the connection (or died).
        WireError: the message is malformed.
    """
    header = _parse_header(_recv(conn, deadline))
    tensors = []
    for item in header["tensors"]:
        name, kind, shape, nbytes = _describe(item)
        _wait(conn, deadline)
        buffer = bytearray(nbytes)
        if conn.recv_bytes_into(buffer) != nbytes:
            raise WireError(f"tensor '{name}': expected {nbytes} bytes")
        if kind == "BYTES":
            array = tensor_from_bytes(memoryview(buffer), kind, shape)
        else:
            dtype = datatypes.BY_KSERVE[kind].numpy
            if nbytes != math.prod(shape) * dtype.itemsize:
                raise WireError(f"tensor '{name}': {nbytes} bytes do not fill shape {shape}")
            array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        tensors.append((name, array))
    return Message(header["kind"], header["meta"], tensors)


def _recv(conn: Connection, deadline: float | None) -> bytes:
    _wait(conn, deadline)
    return conn.recv_bytes(MAX_HEADER_BYTES)


def _wait(conn: Connection, deadline: float | None) -> None:
    if deadline is None:
        return
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError("no message before the deadline")


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("kind"), str)
        or not isinstance(header.get("meta"), dict)
        or not isinstance(header.get("tensors"), list)
    ):
        raise WireError("header needs kind, meta and tensors")
    return header


def _describe(item: Any) -> tuple[str, str, Sequence[int], int]:
    if not isinstance(item, dict):
        raise WireError("tensor description is not an object")
    name, kind, shape, nbytes = (item.get(k) for k in ("name", "datatype", "shape", "nbytes"))
    if (
        not isinstance(name, str)
        or kind not in datatypes.BY_KSERVE
        or not isinstance(shape, list)
        or not all(isinstance(d, int) and d >= 0 for d in shape)
        or not isinstance(nbytes, int)
        or nbytes < 0
    ):
        raise WireError(f"bad tensor description {item!r}")
    return name, str(kind), shape, nbytes
