"""A thousand idle connections and a slow client do not stop normal traffic from being served
(the agent raises its open-file limit and caps connections well above that).

The agent runs as `agent serve` in its own process, as deployed (its own file descriptors, and
uvloop where installed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.agent.api.test_http_errors import GOOD
from tests.models import build_test_repository
from tests.support import wait_listening

IDLE = 1000
REQUESTS = 50


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """An agent with the default limits, serving the test repository."""
    repo = build_test_repository(tmp_path_factory.mktemp("repo") / "models")
    command = [sys.executable, "-m", "agent", "serve", "--model-repository", str(repo)]
    for flag in ("--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1"):
        command.append(flag)
    proc = subprocess.Popen(
        [*command, "--intra-op-threads", "1"], stderr=subprocess.PIPE, text=True
    )
    try:
        yield wait_listening(proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


@contextlib.asynccontextmanager
async def idle_connections(
    port: int, count: int
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    try:
        yield held
    finally:
        for _, writer in held:
            writer.close()


async def slow_client(port: int, stop: asyncio.Event) -> bool:
    """Trickle a request's headers a byte at a time until `stop`; True: still open then."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
    try:
        for byte in head:
            if stop.is_set():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.01)
        return not reader.at_eof()
    finally:
        writer.close()


async def crowded_traffic(port: int) -> tuple[list[int], int, bool]:
    """Statuses of normal requests sent while IDLE connections and a slow client are open;
    then how many idle connections were still open, and whether the slow one was."""
    stop = asyncio.Event()
    async with idle_connections(port, IDLE) as held:
        slow = asyncio.create_task(slow_client(port, stop))
        statuses = []
        async with aiohttp.ClientSession() as session:
            for _ in range(REQUESTS):
                async with session.post(
                    f"http://127.0.0.1:{port}/v2/models/mlp_classifier/infer",
                    data=json.dumps(GOOD),
                ) as response:
                    await response.read()
                    statuses.append(response.status)
        stop.set()
        slow_open = await slow
        await asyncio.sleep(0)
        still_open = sum(not reader.at_eof() for reader, _ in held)
    return statuses, still_open, slow_open


def test_normal_traffic_is_served_beside_1000_idle_connections_and_a_slow_client(
    port: int,
) -> None:
    statuses, still_open, slow_open = asyncio.run(crowded_traffic(port))
    assert statuses == [200] * REQUESTS
    assert still_open == IDLE  # not dropped to make room: they are under the limits
    assert slow_open
