"""`python -m bench.grpc_slow_reader`: the agent's memory beside a gRPC client that never reads.

For each gRPC engine (`--engines loop,grpcio`) it starts the agent (`python -m agent serve`) on
two generated models, `wide` (FP32 [1] → [1, 1048576]: a 4 MiB answer to a 4-byte request) and
`small` (FP32 [1, 4] → [1, 4]), and runs twice on loopback:

    baseline   a normal tritonclient.grpc client calls `small` --requests times
    slow       first a raw HTTP/2 client opens a connection with its flow-control windows at
               2^31-1, sends --calls ModelInfer calls to `wide` and never reads its socket;
               then the normal client's calls again, while it stays connected

It prints, per engine: the calls the slow client got onto the wire, the agent's RSS growth (its
peak during the slow run over its RSS before it), whether every normal call was served, and the
normal client's p99 in both runs. The RSS is sampled until it has not grown for --settle-s (at
most --max-wait-s), so a run takes well under a minute per engine.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import hpack
import numpy as np
import onnx
import psutil
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from agent.proto import grpc_service_pb2 as pb
from agent.runtime.demo import IR_VERSION, OPSET
from bench.procs import MB, AgentProcess, BenchError
from bench.report import markdown_table

WIDE = 1 << 20  # FP32 elements of `wide`'s answer: 4 MiB
MAX_WINDOW = 2**31 - 1
_HEADER = struct.Struct(">BHBBI")


@dataclass(frozen=True, slots=True)
class Result:
    engine: str
    calls_sent: int
    growth_bytes: int
    served: bool
    baseline_p99_ms: float
    slow_p99_ms: float


def _model(
    nodes: list[onnx.NodeProto], x: list[int], y: list[int], init: list[onnx.TensorProto]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y)],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def write_repository(root: Path) -> Path:
    """`wide` and `small` (no batching), each version 1."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, WIDE])
    wide = _model([helper.make_node("Expand", ["X", "shape"], ["Y"])], [1], [1, WIDE], [shape])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    small = _model([helper.make_node("Mul", ["X", "two"], ["Y"])], [1, 4], [1, 4], [two])
    for name, model in (("wide", wide), ("small", small)):
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
    return root


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream) + payload


def wide_request() -> bytes:
    message = pb.ModelInferRequest(model_name="wide")
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    return message.SerializeToString()


def slow_reader(port: int, calls: int) -> tuple[socket.socket, int]:
    """A connection with 2^31-1 windows that sends `calls` ModelInfer calls to `wide` and then
    never reads; returns it (open) and how many calls went out before the socket would block."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    settings = struct.pack(">HIHI", 0x4, MAX_WINDOW, 0x5, 2**24 - 1)
    sock.sendall(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + _frame(0x4, 0, 0, settings)
        + _frame(0x8, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))
        + _frame(0x4, 0x1, 0)  # ACK of the server's SETTINGS, unread (the peer cannot tell)
    )
    encoder = hpack.Encoder()
    body = wide_request()
    message = b"\0" + struct.pack(">I", len(body)) + body
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ModelInfer"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    sock.settimeout(5)
    sent = 0
    for n in range(calls):
        sid = 2 * n + 1
        data = _frame(0x1, 0x4, sid, encoder.encode(fields)) + _frame(0x0, 0x1, sid, message)
        try:
            sock.sendall(data)
        except OSError:  # the agent stopped reading (or closed): what went out counts
            break
        sent += 1
    return sock, sent


def normal_calls(url: str, requests: int) -> tuple[list[float], bool]:
    """Latencies (ms) of `requests` calls to `small`; whether every one was answered right."""
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    latencies: list[float] = []
    served = True
    try:
        for _ in range(requests):
            start = time.perf_counter()
            try:
                result = client.infer("small", [x], client_timeout=30)
                served = served and result.as_numpy("Y")[0, 3] == 6.0
            except Exception:  # any failure is "not served", reported in the table
                served = False
            latencies.append((time.perf_counter() - start) * 1000)
    finally:
        client.close()
    return latencies, served


class _Peak:
    """The agent's RSS peak, sampled every 50 ms on a thread, and when it last grew."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.peak = self._rss()
        self.grew_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        try:
            return int(self._process.memory_info().rss)
        except psutil.Error:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rss = self._rss()
            if rss > self.peak + MB:
                self.grew_at = time.monotonic()
            self.peak = max(self.peak, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_engine(engine: str, repo: Path, args: argparse.Namespace) -> Result:
    with AgentProcess(repo, 1, extra_args=("--grpc-engine", engine)) as agent:
        baseline, ok = normal_calls(agent.grpc_url, args.requests)
        if not ok:
            raise BenchError(f"{engine}: the baseline calls failed:\n{agent.stderr_tail()}")
        before = agent.rss_bytes()
        peak = _Peak(agent.pid)
        sock, sent = slow_reader(agent.grpc_port, args.calls)
        try:
            slow, served = normal_calls(agent.grpc_url, args.requests)
            deadline = time.monotonic() + args.max_wait_s
            while time.monotonic() < min(deadline, peak.grew_at + args.settle_s):
                time.sleep(0.1)
            served = served and agent.alive()
        finally:
            peak.stop()
            sock.close()
    return Result(
        engine,
        sent,
        peak.peak - before,
        served,
        float(np.percentile(baseline, 99)),
        float(np.percentile(slow, 99)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_slow_reader", description=__doc__)
    parser.add_argument("--engines", default="loop,grpcio")
    parser.add_argument("--calls", type=int, default=600, help="calls of the slow client")
    parser.add_argument("--requests", type=int, default=200, help="calls of the normal client")
    parser.add_argument("--settle-s", type=float, default=4.0)
    parser.add_argument("--max-wait-s", type=float, default=25.0)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="slow-reader-") as tmp:
        repo = write_repository(Path(tmp) / "models")
        for engine in args.engines.split(","):
            try:
                results.append(run_engine(engine, repo, args))
            except BenchError as exc:
                print(exc, file=sys.stderr)
                return 1
    rows = [
        [
            r.engine,
            str(r.calls_sent),
            f"{r.growth_bytes / MB:+.0f} MiB",
            "yes" if r.served else "NO",
            f"{r.baseline_p99_ms:.1f}",
            f"{r.slow_p99_ms:.1f}",
        ]
        for r in results
    ]
    headers = [
        "engine",
        "calls sent",
        "RSS growth",
        "normal client served",
        "p99 ms baseline",
        "p99 ms beside",
    ]
    print(markdown_table(headers, rows, [False, True, True, False, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
