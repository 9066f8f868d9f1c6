"""A request whose body is still arriving when the agent stops is answered 503 at once.

aiohttp drops what a connection sends once its server starts to stop, so such a body never
completes; without the policy's stop (`HttpPolicy.begin_stop`) the request held the stop for the
whole body timeout.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from agent.api.http.limits import ClientTimeoutError, StoppingError, must_close
from agent.api.http.policy import HttpPolicy

BODY_TIMEOUT_S = 60.0  # far longer than the test: only the stop can end the wait


async def _serve_one_partial_body(stop_first: bool) -> BaseException | None:
    entered = asyncio.Event()
    outcome: list[BaseException | None] = []
    policy = HttpPolicy(max_request_bytes=1 << 20, body_timeout_s=BODY_TIMEOUT_S)

    async def handler(request: web.Request) -> web.Response:
        entered.set()
        try:
            await policy.read_body(request)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
        return web.json_response({})

    app = web.Application()
    if stop_first:
        policy.begin_stop()
    app.router.add_post("/infer", handler)
    runner = web.AppRunner(app, shutdown_timeout=1.0)  # what is left to close: not under test
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"inputs": []}).encode()
    writer.write(
        b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body) + 100}\r\n\r\n".encode()
        + body  # 100 bytes short: the rest never comes
    )
    await writer.drain()
    await asyncio.wait_for(entered.wait(), 30)
    policy.begin_stop()
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)  # the handler answered
    writer.close()
    await runner.cleanup()
    return outcome[0]


def test_a_body_still_arriving_when_the_stop_begins_is_refused_at_once() -> None:
    error = asyncio.run(_serve_one_partial_body(stop_first=False))
    assert isinstance(error, StoppingError)
    assert must_close(error)  # the rest of its body is never read


def test_a_request_arriving_during_the_stop_is_refused_without_waiting() -> None:
    error = asyncio.run(_serve_one_partial_body(stop_first=True))
    assert isinstance(error, StoppingError)
    assert not isinstance(error, ClientTimeoutError)
