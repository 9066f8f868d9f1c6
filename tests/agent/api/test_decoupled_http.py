"""Decoupled Python models over HTTP: Triton's generate extension, with an aiohttp client.

`generate_stream` answers server-sent events, `generate` exactly one response, `/infer` refuses
a decoupled model with Triton's message; the generate routes serve ordinary models too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.models import add_sub_model, write_model
from tests.python_models import write_python_model
from tests.server import running_agent
from tests.support import wait_until

MODEL = "streamer"


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, MODEL, DECOUPLED_MODEL, decoupled_config(MODEL, markers))
    write_model(repo, "add_sub", add_sub_model())
    two = decoupled_config("streamer_v", markers) + "version_policy: { all { } }\n"
    for version in (1, 2):
        write_python_model(repo, "streamer_v", DECOUPLED_MODEL, two, version=version)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def base(agent: RunningAgent) -> str:
    return f"http://127.0.0.1:{agent.http_port}/v2/models"


async def events(url: str, body: dict[str, Any]) -> tuple[int, str, list[dict[str, Any]]]:
    """POST to a generate_stream URL; the status, content type and every event's JSON."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        found = []
        async for line in response.content:
            if line.startswith(b"data: "):
                found.append(json.loads(line[len(b"data: ") :]))
        return response.status, response.headers["Content-Type"], found


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


def stream_body(n: int, mode: int = 0, error_at: int = -1) -> dict[str, Any]:
    return {"N": n, "MODE": mode, "ERROR_AT": error_at}


def test_generate_stream_sends_every_response_as_an_event(base: str) -> None:
    async def main() -> list[tuple[int, str, list[dict[str, Any]]]]:
        url = f"{base}/{MODEL}/generate_stream"
        return await asyncio.gather(*(events(url, stream_body(3 + k % 2)) for k in range(20)))

    for k, (status, kind, found) in enumerate(asyncio.run(main())):
        assert status == 200
        assert kind == "text/event-stream; charset=utf-8"
        expected = [{"model_name": MODEL, "model_version": "1", "OUT": i} for i in range(3 + k % 2)]
        assert found == expected


def test_generate_stream_with_zero_responses_sends_no_event(base: str) -> None:
    status, _, found = asyncio.run(events(f"{base}/{MODEL}/generate_stream", stream_body(0)))
    assert (status, found) == (200, [])


def test_an_error_mid_stream_is_an_error_event(base: str) -> None:
    url = f"{base}/{MODEL}/versions/1/generate_stream"
    status, _, found = asyncio.run(events(url, stream_body(3, error_at=1)))
    assert status == 200
    assert [e.get("OUT", e.get("error")) for e in found] == [0, "response 1 failed", 2]


def test_generate_answers_exactly_one_response(base: str) -> None:
    status, body = asyncio.run(post(f"{base}/{MODEL}/generate", stream_body(1, mode=1)))
    assert (status, body) == (200, {"model_name": MODEL, "model_version": "1", "OUT": 0})
    status, body = asyncio.run(post(f"{base}/{MODEL}/generate", stream_body(2)))
    assert status == 400
    assert "sent 2 responses" in body["error"]


def test_errors_before_the_stream_starts_are_json_errors(base: str) -> None:
    status, body = asyncio.run(post(f"{base}/nope/generate_stream", stream_body(1)))
    assert status == 404
    assert "error" in body
    status, body = asyncio.run(post(f"{base}/{MODEL}/generate_stream", {"N": "three"}))
    assert status == 400
    assert "error" in body


def test_infer_refuses_a_decoupled_model_with_triton_s_message(base: str) -> None:
    request = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 1], "data": [1]}
            for n in ("N", "MODE", "ERROR_AT")
        ]
    }
    status, body = asyncio.run(post(f"{base}/{MODEL}/infer", request))
    assert status == 501
    assert body == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }


def test_generate_serves_an_ordinary_model(base: str) -> None:
    body = {"INPUT0": [1.0, 2.0, 3.0, 4.0], "INPUT1": [1.0, 1.0, 1.0, 1.0]}
    status, answer = asyncio.run(post(f"{base}/add_sub/generate", body))
    assert status == 200
    assert answer == {
        "model_name": "add_sub",
        "model_version": "1",
        "OUTPUT0": [2.0, 3.0, 4.0, 5.0],
        "OUTPUT1": [0.0, 1.0, 2.0, 3.0],
    }
    status, _, found = asyncio.run(events(f"{base}/add_sub/generate_stream", body))
    assert (status, found) == (200, [answer])


def test_closing_the_connection_stops_the_model_loop(base: str, markers: Path) -> None:
    async def main() -> dict[str, Any]:
        url = f"{base}/{MODEL}/generate_stream"
        async with aiohttp.ClientSession() as session:
            response = await session.post(url, json=stream_body(77, mode=2))
            first = await response.content.readline()
            response.close()  # drops the connection mid-stream
            return dict(json.loads(first[len(b"data: ") :]))

    assert asyncio.run(main())["OUT"] == 0
    wait_until((markers / "cancelled-77").exists, "the model to see the cancellation")


def test_a_canary_routes_and_judges_streamed_requests(base: str) -> None:
    async def status(session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(f"{base}/streamer_v/canary") as got:
            answer: dict[str, Any] = await got.json()
            return answer

    async def main() -> tuple[list[str], dict[str, Any]]:
        versions: list[str] = []
        async with aiohttp.ClientSession() as session:
            policy = {"version": 2, "share": 0.99, "promote_after": 3, "window": 3}
            async with session.post(f"{base}/streamer_v/canary", json=policy) as started:
                assert started.status == 200, await started.text()
            for _ in range(30):  # the candidate takes 99 % of the streams: 3 come soon
                found = (await events(f"{base}/streamer_v/generate_stream", stream_body(2)))[2]
                versions += [event["model_version"] for event in found]
                doc = await status(session)
                if doc["state"] != "RUNNING":
                    return versions, doc
            return versions, await status(session)

    versions, doc = asyncio.run(main())
    assert "2" in versions  # unversioned streams were routed to the candidate
    assert doc["state"] == "PROMOTED"  # and judged: complete streams without error count good
