"""Helpers shared by the test packages: bounded waits, free ports, the agent as a process, clients.

Test modules import helpers from here (or from their package's `support.py`, or `tests.models`
for generated ONNX models), never from another test module.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnxruntime as ort
import pytest

from agent.canary.control import CanaryManager
from agent.canary.policy import CanaryPolicy

T = TypeVar("T")

#: How long a wait lasts by default before it fails the test.
WAIT_S = 30.0


def wait_until(
    check: Callable[[], T],
    what: str = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = 0.02,
) -> T:
    """Poll `check` until it returns something truthy, and return that (bounded).

    Raises:
        AssertionError: `check` never held within `timeout_s`; the message names `what` and the
            last value seen.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what} (last seen: {value!r})"
            )
        time.sleep(interval_s)


async def wait_until_async(
    check: Callable[[], T],
    what: str = "the condition",
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = 0.02,
) -> T:
    """`wait_until` for coroutines: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what} (last seen: {value!r})"
            )
        await asyncio.sleep(interval_s)


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET `url`: the status and body, error statuses included (no exception for 4xx/5xx)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), bytes(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the agent as a child process -------------------------------------------------------------

LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")
METRICS = re.compile(r"metrics on http://[^:]+:(\d+)/metrics")


class AgentLog:
    """Collects an agent process's stderr lines in a thread, so waiting never blocks on a pipe."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._closed = False
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                with self._new:
                    self.lines.append(line)
                    self._new.notify_all()
        except (ValueError, OSError):  # the test closed the pipe
            pass
        with self._new:
            self._closed = True
            self._new.notify_all()

    def wait_for(self, pattern: re.Pattern[str], limit_s: float = 60.0) -> re.Match[str]:
        """The first line matching `pattern` (bounded wait)."""
        deadline = time.monotonic() + limit_s
        seen = 0
        with self._new:
            while True:
                for line in self.lines[seen:]:
                    match = pattern.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(
                        f"no line matching {pattern.pattern!r}:\n" + "".join(self.lines)
                    )
                self._new.wait(timeout=left)


#: The log collector of each agent process started with `wait_listening`, by pid.
LOGS: dict[int, AgentLog] = {}


def wait_listening(proc: subprocess.Popen[str], limit_s: float = 60.0) -> int:
    """Read the agent's log until it says where it listens (bounded wait, no fixed sleep)."""
    log = LOGS.setdefault(proc.pid, AgentLog(proc))
    return int(log.wait_for(LISTENING, limit_s).group(1))


# --- requests to a served MLP ("m": FP32 [-1, 64] -> [-1, 10]) --------------------------------

MLP_X = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(1, 64)


def infer_mlp(port: int, model: str = "m") -> tuple[str, np.ndarray]:
    """One JSON inference of `MLP_X`: (the version that answered, OUTPUT0 flattened)."""
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": MLP_X.ravel().tolist()}
        ]
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{model}/infer",
        data=json.dumps(doc).encode(),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    return out["model_version"], np.array(out["outputs"][0]["data"], dtype=np.float32)


# --- Triton clients' data -----------------------------------------------------------------------

#: KServe datatype → numpy type, as Triton's clients map them.
NP_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


def reference_session(path: Path) -> ort.InferenceSession:
    """ONNX Runtime in-process with the agent's session options (1 intra-op thread)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def sample(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data of a KServe datatype covering its whole range (text for BYTES)."""
    if datatype == "BYTES":
        return np.array(
            [f"s{i}-ü".encode() for i in range(int(np.prod(shape)))], dtype=np.object_
        ).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    dtype = np.dtype(NP_TYPES[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)  # type: ignore[type-var]
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)


# perf_analyzer fails a run whose windows differ by more than --stability-percentage; on a shared
# 2-core CI host they do. These tests check that requests succeed, not that the load is steady,
# so any spread counts as stable and exactly three windows are measured.
PERF_ANALYZER_FIXED_WINDOWS = ("--stability-percentage", "100000", "--max-trials", "3")


def perf_analyzer() -> str:
    """Triton's perf_analyzer binary, or skip the test saying how to install it."""
    path = os.environ.get("PERF_ANALYZER", "")
    if not path or not Path(path).is_file():
        pytest.skip(
            "perf_analyzer is not installed (make perf-analyzer installs it; set PERF_ANALYZER)"
        )
    return path


def perf_analyzer_throughput(*args: str) -> float:
    """Run perf_analyzer with `args` over three fixed windows; its throughput (inf/s), once it
    is checked that the run exited cleanly and printed no error."""
    result = subprocess.run(
        [perf_analyzer(), *args, *PERF_ANALYZER_FIXED_WINDOWS],
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    assert match is not None, output
    assert "error" not in output.lower(), output
    return float(match.group(1))


class RecordingEvents:
    """An EventSink that keeps what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, str, dict[str, object]]] = []

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        self.seen.append((model, version, kind, dict(detail)))

    def kinds(self) -> list[str]:
        return [kind for _, _, kind, _ in self.seen]


def promote(manager: CanaryManager) -> None:
    """Start a canary on version 2 and feed it five good requests (promote_after 5)."""
    manager.start("m", CanaryPolicy(candidate=2, share=0.5, promote_after=5, window=5))
    for _ in range(5):
        manager.record("m", 2, 100, None)
