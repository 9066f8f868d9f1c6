"""`python -m bench.pressure`: the agent's memory under hostile and careless clients, against its
budget.

Each case starts a fresh agent (`python -m agent serve`, a 4 GiB budget as on a small board: a
1 GiB pool for requests in flight) and measures its RSS growth over idle while the case runs
(sampled every 10 ms), against the case's limit:

    cnn burst, HTTP / gRPC   the benchmark CNN (2 instances, max batch 32, dynamic batching) under
                             perf_analyzer at concurrency 32: peak - idle <= 1.1 x its plan
                             (edge_agent_memory_models_bytes)
    JSON 57 MiB              one JSON infer body of 57 MiB (FP32 numbers as tritonclient writes
                             them) to a model that sums its input: <= 3 x the body
    JSON 57 MiB x 6          six at once: within the pool for requests in flight, the rest
                             refused 503
    HTTP slow reader         600 pipelined requests for a 4 MiB output each, never read:
                             <= 128 MiB
    gRPC slow reader         the same over gRPC with the peer's windows at 2^31-1, for each engine
                             (`bench.grpc_slow_reader`), and a normal client's p99: <= 128 MiB
    idle connections         1,000 connections that send nothing: <= 64 MiB
    small streams            200 gRPC ModelStreamInfer streams, one request each, held open:
                             <= 64 MiB

`--soak SECONDS` runs instead a normal client (JSON MLP requests from 4 keep-alive clients)
alone, then for SECONDS beside the hostile clients in a loop (57 MiB bodies, pipelined slow
readers, idle connections), and prints the normal client's p50/p99 both ways and the agent's
peak RSS against its budget. Loopback only; every process it starts is ended by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import onnx
from onnx import TensorProto, helper

from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.fd_limit import raise_open_file_limit
from bench import grpc_slow_reader
from bench.models import MODELS, write_mlp_repositories, write_model_files, write_repository
from bench.perf import find_perf_analyzer, run_perf_analyzer
from bench.procs import AgentProcess, BenchError, RssSampler
from bench.report import load_average, markdown_table

MIB = 1 << 20
BUDGET = 4 << 30


@dataclass(slots=True)
class Case:
    name: str
    what: str
    growth_bytes: int
    limit_bytes: int
    answers: str = ""

    @property
    def met(self) -> bool:
        return self.growth_bytes <= self.limit_bytes


# --- models -------------------------------------------------------------------------------------


def _save(repo: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(version / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config, encoding="utf-8")


def write_pressure_repository(root: Path) -> Path:
    """`wide` (FP32 [1] -> 4 MiB of it) and `small` (`bench.grpc_slow_reader`'s), and `sum`
    (FP32 [-1] -> its sum, [1]), no batching."""
    repo = grpc_slow_reader.write_repository(root / "pressure")
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [-1])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])
    summed = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=1)], "sum", [x], [y]
    )
    _save(
        repo,
        "sum",
        summed,
        'name: "sum"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    return repo


# --- clients ------------------------------------------------------------------------------------


def json_body(target_bytes: int) -> bytes:
    """A KServe JSON infer body for `sum` of about `target_bytes`, FP32 numbers as Python's
    repr writes them (tritonclient's JSON: `tolist()` then `json.dumps`)."""
    count = target_bytes // 21
    data = np.random.default_rng(0).random(count, dtype=np.float32).tolist()
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [count], "data": data}]}
    return json.dumps(doc).encode()


def http_post(port: int, path: str, body: bytes, headers: str = "") -> int:
    """One request on its own connection; the answer's status (0: the connection broke)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
            sock.sendall(head)
            with contextlib.suppress(OSError):  # a refusal closes before the body is sent
                sock.sendall(body)
            answer = b""
            while b"\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    return 0
                answer += chunk
            return int(answer.split(b" ", 2)[1])
    except OSError:
        return 0


def binary_wide_request() -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.ones(1, dtype=np.float32).tobytes()
    return (
        f"POST /v2/models/wide/infer HTTP/1.1\r\nHost: localhost\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@contextlib.contextmanager
def pipelined_slow_reader(port: int, count: int) -> Iterator[socket.socket]:
    """`count` pipelined requests for 4 MiB each, sent as far as the agent reads; never read."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    data = memoryview(binary_wide_request() * count)
    try:
        with contextlib.suppress(BlockingIOError, OSError):
            while data:
                sent = sock.send(data)
                data = data[sent:]
        yield sock
    finally:
        sock.close()


@contextlib.contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


async def small_streams(grpc_port: int, count: int, hold: asyncio.Event) -> int:
    """`count` ModelStreamInfer streams on one channel, one MLP request each, held open until
    `hold`; returns how many got their answer."""
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), dtype=np.float32).tobytes())
    answered = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

        async def one() -> None:
            nonlocal answered

            async def requests() -> object:
                yield request
                await hold.wait()

            call = stub.ModelStreamInfer(requests())
            async for reply in call:
                if not reply.error_message:
                    answered += 1
                break
            await hold.wait()
            call.cancel()

        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        while answered < count and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # held open, answered: the sample below sees them
        hold.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return answered


# --- cases --------------------------------------------------------------------------------------


def growth_while(agent: AgentProcess, action: Callable[[], str]) -> tuple[int, str]:
    """RSS peak over idle while `action` runs (sampled every 10 ms); `action`'s summary."""
    idle = agent.rss_bytes()
    with RssSampler(agent.pid, interval_s=0.01, series_every_s=3600) as sampler:
        summary = action()
    return max(0, sampler.peak - idle), summary


def start(repo: Path, *args: str) -> AgentProcess:
    agent = AgentProcess(
        repo, intra_op_threads=1, extra_args=("--memory-budget-bytes", str(BUDGET), *args)
    )
    agent.start()
    return agent


def case_json(repo: Path, size: int, parallel: int, body: bytes) -> Case:
    with contextlib.closing(_Stopper(start(repo))) as running:
        agent = running.agent
        http_post(agent.port, "/v2/models/sum/infer", json_body(1024))  # warm

        def send() -> str:
            codes: list[int] = [0] * parallel

            def one(i: int) -> None:
                codes[i] = http_post(agent.port, "/v2/models/sum/infer", body)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(parallel)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return ", ".join(f"{codes.count(c)} x {c}" for c in sorted(set(codes)))

        growth, answers = growth_while(agent, send)
    if parallel == 1:
        return Case(f"JSON {len(body) / MIB:.0f} MiB", "one body", growth, 3 * len(body), answers)
    return Case(
        f"JSON {len(body) / MIB:.0f} MiB x {parallel}",
        "at once",
        growth,
        min(BUDGET // 4, 1 << 30),
        answers,
    )


def case_http_slow_reader(repo: Path, count: int) -> Case:
    with contextlib.closing(_Stopper(start(repo))) as running:
        agent = running.agent
        http_post(agent.port, "/v2/models/wide/infer", b"", "")  # warm the listener

        def stall() -> str:
            with pipelined_slow_reader(agent.port, count):
                time.sleep(5.0)  # the agent answers what it can; the socket is never read
            return f"{count} pipelined, never read"

        growth, answers = growth_while(agent, stall)
    return Case("HTTP slow reader", "4 MiB answers", growth, 128 * MIB, answers)


def case_idle(repo: Path, count: int) -> Case:
    with contextlib.closing(_Stopper(start(repo))) as running:
        agent = running.agent

        def hold() -> str:
            with idle_connections(agent.port, count):
                time.sleep(2.0)
            return f"{count} held"

        growth, answers = growth_while(agent, hold)
    return Case("idle connections", "connected, silent", growth, 64 * MIB, answers)


def case_streams(repo: Path, count: int) -> Case:
    with contextlib.closing(_Stopper(start(repo))) as running:
        agent = running.agent

        def streams() -> str:
            answered = asyncio.run(small_streams(agent.grpc_port, count, asyncio.Event()))
            return f"{answered}/{count} answered"

        growth, answers = growth_while(agent, streams)
    return Case("small gRPC streams", "held open", growth, 64 * MIB, answers)


def case_cnn(root: Path, perf: str, protocol: str, seconds: float) -> Case:
    model = MODELS["cnn"]
    onnx_path = write_model_files(root, [model])["cnn"]
    repo = write_repository(root, model, "dynbatch", onnx_path)
    with contextlib.closing(_Stopper(start(repo, "--intra-op-threads", "1"))) as running:
        agent = running.agent
        plan = agent.memory_plan_bytes()
        url = agent.url if protocol == "http" else agent.grpc_url
        interval = max(model.min_interval_ms, int(seconds * 1000 / 3))

        def burst() -> str:
            result = run_perf_analyzer(
                perf, model.served_name, url, 32, interval, root, protocol=protocol
            )
            return f"{result.throughput:,.0f} inf/s"

        growth, answers = growth_while(agent, burst)
    return Case(
        f"CNN burst, {protocol}",
        f"c=32, plan {plan / MIB:.0f} MiB",
        growth,
        int(1.1 * plan),
        answers,
    )


class _Stopper:
    """An agent ended by its pid when the case ends, whatever happened."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent

    def close(self) -> None:
        self.agent.stop()


def grpc_slow_reader_cases(root: Path) -> list[Case]:
    """`bench.grpc_slow_reader` on each engine: 600 calls for 4 MiB each with the windows at
    2^31-1, never read, beside a normal client (its p99 alone and beside, in the answers)."""
    repo = grpc_slow_reader.write_repository(root / "slow-reader")
    args = argparse.Namespace(calls=600, requests=200, settle_s=4.0, max_wait_s=25.0)
    cases = []
    for engine in ("loop", "grpcio"):
        r = grpc_slow_reader.run_engine(engine, repo, args)
        served = "served" if r.served else "NOT served"
        cases.append(
            Case(
                f"gRPC slow reader, {engine}",
                "4 MiB answers, windows 2^31-1",
                r.growth_bytes,
                128 * MIB,
                f"{r.calls_sent} sent; others {served}, p99 "
                f"{r.baseline_p99_ms:.1f} -> {r.slow_p99_ms:.1f} ms",
            )
        )
    return cases


# --- soak ---------------------------------------------------------------------------------------


async def normal_traffic(port: int, seconds: float, clients: int = 4) -> list[float]:
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64},
        ]
    }
    body = json.dumps(doc).encode()
    url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def client() -> None:
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                began = time.perf_counter()
                async with session.post(url, data=body) as response:
                    await response.read()
                latencies.append((time.perf_counter() - began) * 1e6)

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def hostile_loop(port: int, stop: Any, rounds: Any) -> None:
    """The soak's hostile clients, in a process of their own (so the normal client's figures are
    the agent's, not this process's GIL): each round three 57 MiB JSON bodies at once, a
    pipelined reader of 200 answers of 4 MiB that never reads, 300 idle connections."""
    big = json_body(57 * MIB)
    while not stop.is_set():
        threads = [
            threading.Thread(target=http_post, args=(port, "/v2/models/sum/infer", big))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        with pipelined_slow_reader(port, 200), idle_connections(port, 300):
            stop.wait(3.0)
        for thread in threads:
            thread.join()
        rounds.value += 1


def soak(root: Path, seconds: float) -> int:
    repo = write_pressure_repository(root)
    mlp = write_mlp_repositories(root, "nobatch")["nobatch"]
    for entry in mlp.iterdir():  # one repository: the MLP beside sum and wide
        entry.rename(repo / entry.name)
    processes = multiprocessing.get_context("spawn")
    with contextlib.closing(_Stopper(start(repo))) as running:
        agent = running.agent
        idle = agent.rss_bytes()
        baseline = asyncio.run(normal_traffic(agent.port, min(30.0, seconds / 3)))
        stop = processes.Event()
        rounds = processes.Value("i", 0)
        with RssSampler(agent.pid, interval_s=0.05, series_every_s=60) as sampler:
            hostile = processes.Process(target=hostile_loop, args=(agent.port, stop, rounds))
            hostile.start()
            try:
                crowded = asyncio.run(normal_traffic(agent.port, seconds))
            finally:
                stop.set()
                hostile.join(timeout=120)
                if hostile.is_alive():
                    hostile.kill()  # by its pid, as every process this bench started
    hostile_done = [rounds.value]
    p = np.percentile
    rows = [
        ["alone", f"{len(baseline):,}", f"{p(baseline, 50):.0f}", f"{p(baseline, 99):.0f}"],
        [
            "beside hostile clients",
            f"{len(crowded):,}",
            f"{p(crowded, 50):.0f}",
            f"{p(crowded, 99):.0f}",
        ],
    ]
    print(
        markdown_table(
            ["normal client", "requests", "p50 µs", "p99 µs"], rows, [False, True, True, True]
        )
    )
    ratio = p(crowded, 99) / p(baseline, 99)
    print(
        f"\n{seconds:.0f} s soak, {hostile_done[0]} hostile rounds; p99 {ratio:.2f} x alone; "
        f"RSS idle {idle / MIB:.0f} MiB, peak {sampler.peak / MIB:.0f} MiB of a "
        f"{BUDGET / MIB:.0f} MiB budget"
    )
    return 0 if sampler.peak - idle <= BUDGET else 1


# --- main ---------------------------------------------------------------------------------------


def render(cases: Sequence[Case]) -> str:
    rows = [
        [
            c.name,
            c.what,
            c.answers,
            f"{c.growth_bytes / MIB:,.1f}",
            f"{c.limit_bytes / MIB:,.1f}",
            "met" if c.met else "MISSED",
        ]
        for c in cases
    ]
    return markdown_table(
        ["case", "what", "answers", "RSS growth MiB", "limit MiB", "verdict"],
        rows,
        [False, False, False, True, True, False],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of the soak instead")
    parser.add_argument("--json-mib", type=int, default=57)
    parser.add_argument("--cnn-seconds", type=float, default=9.0)
    parser.add_argument("--perf-analyzer", default=None)
    args = parser.parse_args(argv)
    raise_open_file_limit()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="pressure-") as tmp:
        root = Path(tmp)
        if args.soak:
            return soak(root, args.soak)
        repo = write_pressure_repository(root)
        mlp = write_mlp_repositories(root, "nobatch")["nobatch"]
        for entry in mlp.iterdir():
            entry.rename(repo / entry.name)
        size = args.json_mib * MIB
        body = json_body(size)
        cases = [
            case_json(repo, size, 1, body),
            case_json(repo, size, 6, body),
            case_http_slow_reader(repo, 600),
            *grpc_slow_reader_cases(root),
            case_idle(repo, 1000),
            case_streams(repo, 200),
        ]
        perf = find_perf_analyzer(args.perf_analyzer)
        if perf is None:
            print("CNN burst: perf_analyzer not found (make perf-analyzer); skipped")
        else:
            for protocol in ("http", "grpc"):
                try:
                    cases.append(case_cnn(root, perf, protocol, args.cnn_seconds))
                except BenchError as exc:
                    print(f"CNN burst over {protocol}: {exc}")
    print(render(cases))
    print(
        f"\nbudget {BUDGET / MIB:.0f} MiB; load average before/after: "
        f"{load_before:.2f} / {load_average():.2f}"
    )
    return 0 if all(c.met for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
