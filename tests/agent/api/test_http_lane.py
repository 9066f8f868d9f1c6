"""The HTTP infer lane (`agent.api.http.lane`): `/infer` requests in its shape are answered
straight from the connection, exactly as aiohttp's handler answers them; anything else goes to
aiohttp with every byte the lane received, at a request boundary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.api.http import lane as http_lane
from agent.api.http.lane import InferLane, cached_infer_head, parse_infer_head
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.agent.api.test_http_errors import GOOD, binary_request
from tests.server import running_agent

MODEL = "mlp_classifier"
INFER = f"/v2/models/{MODEL}/infer"

TRITONCLIENT_HEAD = (
    b"POST /v2/models/mlp_classifier/versions/1/infer HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8000\r\nUser-Agent: python/gevent-http-client-1.5.5\r\n"
    b"Inference-Header-Content-Length: 120\r\nContent-Length: 376\r\n"
    b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
)


# ---- the head parser (pure) ----


def test_a_tritonclient_head_is_the_lanes() -> None:
    head = parse_infer_head(TRITONCLIENT_HEAD)
    assert head is not None
    assert (head.model, head.version) == ("mlp_classifier", "1")
    assert (head.content_length, head.header_length, head.keep_alive) == (376, 120, True)
    assert head.trace_headers == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }


def test_connection_close_and_no_version_are_read() -> None:
    head = parse_infer_head(
        b"POST /v2/models/m.x-1/infer HTTP/1.1\r\nhost: x\r\nCONTENT-LENGTH:  7 \r\n"
        b"Connection: Close"
    )
    assert head is not None
    assert (head.model, head.version, head.content_length) == ("m.x-1", None, 7)
    assert not head.keep_alive
    assert head.header_length is None


def test_a_repeated_head_is_parsed_once_and_the_cache_stays_small() -> None:
    first = cached_infer_head(TRITONCLIENT_HEAD)
    assert first == parse_infer_head(TRITONCLIENT_HEAD)
    assert cached_infer_head(bytes(TRITONCLIENT_HEAD)) is first  # the same bytes: no parse
    refused = TRITONCLIENT_HEAD.replace(b"Host", b"Expect: 100-continue\r\nHost")
    assert cached_infer_head(refused) is None  # refusals are remembered too, as refusals
    for length in range(1, 500):  # a client whose every head differs
        head = cached_infer_head(SHAPED[:-1] + str(length).encode())
        assert head is not None
        assert head.content_length == length
    assert len(http_lane._heads) <= 64


SHAPED = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1"


def test_the_shape_itself_is_the_lanes() -> None:
    assert parse_infer_head(SHAPED) is not None


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 1",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 1\r\nHost: a\r\nHost: b",
        b"GET /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m/infer HTTP/1.0\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m/ready HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m%2Fx/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m/versions/one/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nX: y",  # no Content-Length
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: +1",
        SHAPED + b"\r\nTransfer-Encoding: chunked",
        SHAPED + b"\r\nContent-Encoding: gzip",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nExpect: 100-continue",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: Upgrade",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nX-A: b\r\n folded",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nBad Name: b",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nX-A: b\x00c",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nno colon",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
        b"Inference-Header-Content-Length: 1_0",
    ],
    ids=[
        "no Host",
        "two Hosts",
        "GET",
        "HTTP/1.0",
        "another route",
        "percent-encoded path",
        "query",
        "version not a number",
        "no Content-Length",
        "two Content-Lengths",
        "signed length",
        "chunked",
        "encoded body",
        "Expect",
        "upgrade",
        "folded line",
        "space in a name",
        "NUL in a value",
        "no colon",
        "header length not digits",
    ],
)
def test_anything_else_is_left_to_aiohttp(head: bytes) -> None:
    assert parse_infer_head(head) is None


# ---- on a running agent ----


@pytest.fixture(scope="module")
def slow_body_agent(model_repo: Path) -> Iterator[RunningAgent]:
    """Short header and body timeouts, so a slow body is handed over and timed out quickly."""
    config = AgentConfig(
        server=ServerConfig(
            http_port=0, grpc_port=-1, metrics_port=-1, header_timeout_ms=400, body_timeout_ms=300
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture(scope="module")
def laneless_agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, http_infer_lane=False),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


def lane_of(agent: RunningAgent) -> InferLane:
    assert agent.infer_lane is not None
    return agent.infer_lane


def request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


GET_READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n\r\n"


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> dict[str, object]:
        doc = json.loads(self.body)
        assert isinstance(doc, dict)
        return doc


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 30)
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(port: int, chunks: list[bytes], answers: int) -> list[Answer]:
    """Send `chunks` (each as its own write), then read `answers` answers on one connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        return [await read_answer(reader) for _ in range(answers)]
    finally:
        writer.close()


def run(coro: object) -> list[Answer]:
    return asyncio.run(coro)  # type: ignore[arg-type]


BINARY_BODY, BINARY_HEADERS = binary_request(256, np.full(64, 0.5, np.float32).tobytes())
CASES = {
    "JSON": (INFER, json.dumps(GOOD).encode(), {}),
    "binary": (INFER, BINARY_BODY, BINARY_HEADERS),
    "versioned": (f"/v2/models/{MODEL}/versions/1/infer", json.dumps(GOOD).encode(), {}),
    "unknown model": ("/v2/models/nope/infer", json.dumps(GOOD).encode(), {}),
    "unknown version": (f"/v2/models/{MODEL}/versions/9/infer", json.dumps(GOOD).encode(), {}),
    "malformed JSON": (INFER, b"{not json", {}),
    "wrong input": (INFER, json.dumps({"inputs": [{"name": "X"}]}).encode(), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_lane_answers_as_aiohttp_does(agent: RunningAgent, case: str) -> None:
    path, body, headers = CASES[case]
    lane = lane_of(agent)
    served, handed_over = lane.served, lane.handed_over
    (by_lane,) = run(exchange(agent.http_port, [request(path, body, headers)], 1))
    assert lane.served == served + 1
    # A connection that asked for anything else first is aiohttp's from then on.
    _, by_aiohttp = run(exchange(agent.http_port, [GET_READY, request(path, body, headers)], 2))
    assert lane.served == served + 1
    assert lane.handed_over == handed_over + 1
    assert by_lane.status == by_aiohttp.status
    assert by_lane.body == by_aiohttp.body
    for name in ("content-type", "inference-header-content-length", "connection"):
        assert by_lane.headers.get(name) == by_aiohttp.headers.get(name), name
    if by_lane.status == 200:
        assert "outputs" in by_lane.json() or "inference-header-content-length" in by_lane.headers
    else:
        assert set(by_lane.json()) == {"error"}


def test_pipelined_requests_are_answered_in_order_across_the_hand_over(
    agent: RunningAgent,
) -> None:
    one = request(INFER, json.dumps(dict(GOOD, id="one")).encode())
    two = request(INFER, json.dumps(dict(GOOD, id="two")).encode())
    three = request(INFER, json.dumps(dict(GOOD, id="three")).encode())
    lane = lane_of(agent)
    served = lane.served
    answers = run(exchange(agent.http_port, [one + two + GET_READY + three], 4))
    assert [a.status for a in answers] == [200, 200, 200, 200]
    assert [answers[0].json()["id"], answers[1].json()["id"]] == ["one", "two"]
    assert answers[2].json() == {"ready": True}
    assert answers[3].json()["id"] == "three"  # by aiohttp, after the hand-over
    assert lane.served == served + 2


def test_a_request_split_across_many_writes_is_put_together(agent: RunningAgent) -> None:
    whole = request(INFER, BINARY_BODY, BINARY_HEADERS)
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    lane = lane_of(agent)
    served = lane.served
    (answer,) = run(exchange(agent.http_port, pieces, 1))
    assert answer.status == 200
    assert lane.served == served + 1
    outputs = answer.json()["outputs"]
    assert isinstance(outputs, list)
    assert outputs[0]["shape"] == [1, 10]


def test_connection_close_is_honoured(agent: RunningAgent) -> None:
    async def scenario() -> tuple[Answer, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", agent.http_port)
        writer.write(request(INFER, json.dumps(GOOD).encode(), {"Connection": "close"}))
        answer = await read_answer(reader)
        rest = await asyncio.wait_for(reader.read(), 30)  # the server closes: EOF
        writer.close()
        return answer, rest

    answer, rest = asyncio.run(scenario())
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert rest == b""


def test_a_body_over_the_limit_is_aiohttps_413(agent: RunningAgent) -> None:
    head = b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: t\r\nContent-Length: 9999999\r\n\r\n"
    (answer,) = run(exchange(agent.http_port, [head], 1))  # the body is never sent
    assert answer.status == 413
    assert "over the limit" in str(answer.json()["error"])


def test_a_slow_body_is_handed_over_and_timed_out(slow_body_agent: RunningAgent) -> None:
    body = json.dumps(GOOD).encode()
    lane = lane_of(slow_body_agent)
    handed_over = lane.handed_over

    cut = request(INFER, body)[:-10]  # the last 10 bytes never come
    (answer,) = run(exchange(slow_body_agent.http_port, [cut], 1))
    assert answer.status == 408
    assert "body_timeout_ms" in str(answer.json()["error"])
    assert lane.handed_over == handed_over + 1


def test_with_the_lane_off_aiohttp_answers_every_request(
    agent: RunningAgent, laneless_agent: RunningAgent
) -> None:
    assert laneless_agent.infer_lane is None
    path, body, headers = CASES["binary"]
    (without,) = run(exchange(laneless_agent.http_port, [request(path, body, headers)], 1))
    (with_lane,) = run(exchange(agent.http_port, [request(path, body, headers)], 1))
    assert without.status == 200
    assert without.body == with_lane.body
    assert "server" in without.headers  # aiohttp's own answer


def test_a_pipelining_client_is_paused_not_buffered_and_all_is_answered(
    agent: RunningAgent,
) -> None:
    """More than `max_request_bytes` (1 MiB here) of requests pipelined behind a running one:
    the lane stops reading until it catches up, and every request is answered in order."""
    count = 4000
    requests = [request(INFER, json.dumps(dict(GOOD, id=str(i))).encode()) for i in range(count)]
    assert sum(map(len, requests)) > 1 << 20

    async def scenario() -> list[Answer]:
        reader, writer = await asyncio.open_connection("127.0.0.1", agent.http_port)
        writer.write(b"".join(requests))
        sending = asyncio.ensure_future(writer.drain())
        answers = [await read_answer(reader) for _ in range(count)]
        await sending
        writer.close()
        return answers

    lane = lane_of(agent)
    served = lane.served
    answers = asyncio.run(scenario())
    assert [a.json()["id"] for a in answers] == [str(i) for i in range(count)]
    assert lane.served == served + count
