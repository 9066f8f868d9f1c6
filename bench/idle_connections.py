"""`python -m bench.idle_connections`: latency of normal traffic beside idle and slow clients.

Starts the agent (`python -m agent serve`, default limits) on the benchmark MLP (bench.models,
no batching) and sends the same number of JSON infer requests over HTTP from a few keep-alive
aiohttp clients, twice in the same run:

    baseline   nothing else connected
    crowded    with --idle connections open and idle (connected, nothing sent) and one slow
               client trickling a request's headers a byte every 10 ms

and prints p50/p99 latency of each, and the crowded run against the baseline. The idle
connections must all still be open at the end (they are under `server.max_connections` and
`server.idle_timeout_ms`), or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from agent.runtime.fd_limit import raise_open_file_limit
from bench.models import write_mlp_repositories
from bench.procs import AgentProcess, BenchError
from bench.report import load_average, markdown_table


@dataclass(frozen=True, slots=True)
class Run:
    scenario: str
    requests: int
    errors: int
    p50_us: float
    p99_us: float
    seconds: float


def infer_body() -> bytes:
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": x.tolist()}]}
    return json.dumps(doc).encode()


async def traffic(url: str, requests: int, clients: int) -> tuple[list[float], int]:
    """Latencies (µs) of `requests` infer calls from `clients` keep-alive clients; errors."""
    body = infer_body()
    latencies: list[float] = []
    errors = 0

    async def client(count: int) -> None:
        nonlocal errors
        async with aiohttp.ClientSession() as session:
            for _ in range(count):
                start = time.perf_counter()
                async with session.post(url, data=body) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                latencies.append((time.perf_counter() - start) * 1e6)

    await asyncio.gather(*(client(requests // clients) for _ in range(clients)))
    return latencies, errors


async def slow_client(port: int, stop: asyncio.Event) -> bool:
    """Trickle headers a byte every 10 ms until `stop`; True: the connection was still open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 8000
    try:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.01)
            if stop.is_set() or reader.at_eof():
                break
        return not reader.at_eof()
    finally:
        writer.close()


async def measure(port: int, requests: int, clients: int, idle: int) -> list[Run]:
    url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
    await traffic(url, clients * 20, clients)  # warm-up
    runs = []
    start = time.monotonic()
    latencies, errors = await traffic(url, requests, clients)
    runs.append(_run("baseline", latencies, errors, time.monotonic() - start))
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(idle)]
    stop = asyncio.Event()
    slow = asyncio.create_task(slow_client(port, stop))
    try:
        start = time.monotonic()
        latencies, errors = await traffic(url, requests, clients)
        runs.append(_run(f"{idle} idle + 1 slow", latencies, errors, time.monotonic() - start))
        stop.set()
        slow_open = await slow
        open_idle = sum(not reader.at_eof() for reader, _ in held)
    finally:
        for _, writer in held:
            writer.close()
    if open_idle != idle or not slow_open:
        raise BenchError(f"{open_idle}/{idle} idle connections open, slow client open: {slow_open}")
    return runs


def _run(scenario: str, latencies: list[float], errors: int, seconds: float) -> Run:
    p50, p99 = np.percentile(latencies, [50, 99])
    return Run(scenario, len(latencies), errors, float(p50), float(p99), seconds)


def render(runs: Sequence[Run]) -> str:
    base = runs[0]
    rows = [
        [
            r.scenario,
            f"{r.requests:,}",
            str(r.errors),
            f"{r.requests / r.seconds:,.0f}",
            f"{r.p50_us:.0f}",
            f"{r.p99_us:.0f}",
            f"{r.p50_us / base.p50_us:.2f}x",
            f"{r.p99_us / base.p99_us:.2f}x",
        ]
        for r in runs
    ]
    header = [
        "scenario", "requests", "errors", "req/s", "p50 µs", "p99 µs",
        "p50 vs baseline", "p99 vs baseline",
    ]  # fmt: skip
    return markdown_table(header, rows, [False] + [True] * 7)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4, help="keep-alive clients")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections held")
    args = parser.parse_args(argv)
    raise_open_file_limit()  # this process holds the idle connections
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="idle-connections-") as tmp:
        root = Path(tmp)
        repo = write_mlp_repositories(root, "nobatch")["nobatch"]
        with AgentProcess(repo, intra_op_threads=1) as agent:
            runs = asyncio.run(measure(agent.port, args.requests, args.clients, args.idle))
    print(render(runs))
    print(f"\nload average before/after: {load_before:.2f} / {load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
