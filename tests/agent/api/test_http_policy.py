"""One HTTP front door (`agent.api.http.policy`): no route and no fast path escapes the policy.

The walks go over the router of the app the agent serves (every route, HEAD variants and the
infer lane's `/infer` shapes included) and send each request in the lane's shape (HTTP/1.1, one
Host, a Content-Length), on a fresh connection, as tritonclient would: a new route, or a new fast
path that answers without the policy, fails them. With every API group restricted every route
is refused 403 without its header, and the answers follow the policy when a reload swaps the
restrictions; the status token guards the status routes; once the stop began, a request whose
body is still arriving gets 503 on every route. A refusal the lane answers is byte for byte
aiohttp's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from agent.api.access import (
    ENDPOINT_GROUPS,
    GROUPS,
    ApiAccess,
    http_endpoint,
    parse_restrictions,
)
from agent.api.http.lane import INFER_LANE, INFER_ROUTE, VERSION_INFER_ROUTE
from agent.api.http.limits import ConnectionLimits, StoppingError
from agent.api.http.policy import HTTP_POLICY, HttpPolicy
from agent.api.status_page import STATUS_PATHS
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.errors import PayloadTooLargeError
from agent.runtime.daemon import RunningAgent
from tests.agent.api.test_http_errors import GOOD
from tests.server import running_agent

TOKEN = "status-token"
MAX_BYTES = 1 << 20
PATH_VALUES = {"model": "mlp_classifier", "version": "1", "region": "r"}


def _key(group: str) -> tuple[str, str]:
    return f"key-{group}", f"value-{group}"


def _config(model_repo: Path) -> AgentConfig:
    return AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=-1,
            metrics_port=-1,
            max_request_bytes=MAX_BYTES,
            http_restricted_api=tuple("{}:{}={}".format(g, *_key(g)) for g in GROUPS),
            status_token=TOKEN,
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )


@pytest.fixture(scope="module")
def guarded(model_repo: Path) -> Iterator[RunningAgent]:
    """Every HTTP group restricted (each its own header), the status page behind a token."""
    with running_agent(_config(model_repo)) as agent:
        yield agent


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    canonical: str

    @property
    def path(self) -> str:
        return self.canonical.format(**PATH_VALUES)

    @property
    def group(self) -> str:
        return ENDPOINT_GROUPS[http_endpoint(self.method, self.canonical)]

    @property
    def guarded_by_token(self) -> bool:
        return self.canonical in STATUS_PATHS


def routes_of(app: web.Application) -> list[Route]:
    """Every route of the served app; a walk that misses one of the lane's shapes is wrong."""
    routes = [
        Route(route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
    ]
    shapes = {(r.method, r.canonical) for r in routes}
    assert {("POST", INFER_ROUTE), ("POST", VERSION_INFER_ROUTE)} <= shapes
    assert any(r.method == "HEAD" for r in routes)
    return routes


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server says it closes the connection after it


def raw_request(
    route: Route, headers: dict[str, str], body: bytes, declared: int | None = None
) -> bytes:
    """The request in the lane's shape: what tritonclient and perf_analyzer send."""
    length = len(body) if declared is None else declared
    lines = [f"{route.method} {route.path} HTTP/1.1", "Host: test", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read(reader: asyncio.StreamReader, head_only: bool) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head_only else int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 30)
    closed = headers.get("connection", "").lower() == "close"
    return Answer(int(status_line.split()[1]), headers, body, closed)


def exchange(port: int, *requests: tuple[bytes, bool]) -> list[Answer]:
    """Send each (request, head_only) on one fresh connection and read each answer."""

    async def scenario() -> list[Answer]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        try:
            for data, head_only in requests:
                writer.write(data)
                await writer.drain()
                answers.append(await _read(reader, head_only))
        finally:
            writer.close()
        return answers

    return asyncio.run(scenario())


def body_of(route: Route) -> bytes:
    return json.dumps(GOOD).encode() if route.method in ("POST", "DELETE") else b""


def restricted_message(header: str) -> bytes:
    return json.dumps({"error": f"This API is restricted, expecting header '{header}'"}).encode()


def token_header() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


# ---- every route, every rule ----


def test_the_lane_and_the_middleware_hold_the_same_policy(guarded: RunningAgent) -> None:
    app = guarded.http_app
    assert app[INFER_LANE].policy is app[HTTP_POLICY]
    assert len(app.middlewares) == 1  # the one door's middleware, from create_app; none added


def test_with_every_group_restricted_every_route_is_refused_without_its_header(
    guarded: RunningAgent,
) -> None:
    for route in routes_of(guarded.http_app):
        headers = token_header() if route.guarded_by_token else {}
        (answer,) = exchange(
            guarded.http_port, (raw_request(route, headers, body_of(route)), route.method == "HEAD")
        )
        assert answer.status == 403, route
        if route.method != "HEAD":
            assert answer.body == restricted_message(_key(route.group)[0]), route
        # ... and the header of its own group lets it past the policy.
        name, value = _key(route.group)
        (passed,) = exchange(
            guarded.http_port,
            (raw_request(route, {**headers, name: value}, body_of(route)), route.method == "HEAD"),
        )
        assert passed.status not in (401, 403), (route, passed.body)


def test_a_reload_that_swaps_the_restrictions_is_what_every_route_answers(
    guarded: RunningAgent,
) -> None:
    """The answers come from the live policy: no door keeps its own copy of the rules."""
    assert guarded.access is not None
    before = guarded.access.http
    guarded.access.http = parse_restrictions([",".join(GROUPS) + ":rotated-key=v2"])
    try:
        for route in routes_of(guarded.http_app):
            if route.method == "HEAD":
                continue
            headers = token_header() if route.guarded_by_token else {}
            old_header = dict([_key(route.group)])
            (answer,) = exchange(
                guarded.http_port,
                (raw_request(route, {**headers, **old_header}, body_of(route)), False),
            )
            assert answer.status == 403, route
            assert answer.body == restricted_message("rotated-key"), route
    finally:
        guarded.access.http = before


def test_the_status_token_guards_the_status_routes(guarded: RunningAgent) -> None:
    status_routes = [r for r in routes_of(guarded.http_app) if r.guarded_by_token]
    assert {r.canonical for r in status_routes} == set(STATUS_PATHS)
    for route in status_routes:
        name, value = _key(route.group)
        for token in ({}, {"Authorization": "Bearer wrong"}):
            (answer,) = exchange(
                guarded.http_port,
                (raw_request(route, {name: value, **token}, b""), route.method == "HEAD"),
            )
            assert answer.status == 401, (route, token)
        (answer,) = exchange(
            guarded.http_port,
            (raw_request(route, {name: value, **token_header()}, b""), route.method == "HEAD"),
        )
        assert answer.status == 200, route


def test_once_the_stop_began_a_body_still_arriving_is_refused_on_every_route(
    model_repo: Path,
) -> None:
    with running_agent(_config(model_repo)) as agent:
        agent.http_app[HTTP_POLICY].begin_stop()  # what the listener's stop does first
        stopping = json.dumps(
            {"error": "the server is stopping: the request body did not arrive before"}
        ).encode()
        for route in routes_of(agent.http_app):
            name, value = _key(route.group)
            headers = {name: value, **token_header()}  # admitted by rules 1 and 2
            partial = raw_request(route, headers, b"{" * 10, declared=100)  # 90 bytes never come
            (answer,) = exchange(agent.http_port, (partial, route.method == "HEAD"))
            assert answer.status == 503, route
            if route.method != "HEAD":
                assert answer.body == stopping, route
                assert answer.closed, route  # the rest of its body is never read


# ---- the lane's refusals are aiohttp's, byte for byte ----

INFER = Route("POST", INFER_ROUTE)
LIVE = Route("GET", "/v2/health/live")


def _by_lane_and_by_aiohttp(port: int, request: bytes) -> tuple[Answer, Answer]:
    """The same request first on a fresh connection (the lane's), then after a GET has given
    the connection to aiohttp."""
    (by_lane,) = exchange(port, (request, False))
    live = raw_request(LIVE, dict([_key("health")]), b"")
    _, by_aiohttp = exchange(port, (live, False), (request, False))
    return by_lane, by_aiohttp


def _assert_same(by_lane: Answer, by_aiohttp: Answer) -> None:
    assert by_lane.status == by_aiohttp.status
    assert by_lane.body == by_aiohttp.body
    assert by_lane.closed == by_aiohttp.closed
    for name in ("content-type", "connection", "content-length"):
        assert by_lane.headers.get(name) == by_aiohttp.headers.get(name), name


def test_a_restricted_infer_refused_by_the_lane_is_aiohttps_answer(guarded: RunningAgent) -> None:
    lane = guarded.http_app[INFER_LANE]
    served = lane.served
    by_lane, by_aiohttp = _by_lane_and_by_aiohttp(
        guarded.http_port, raw_request(INFER, {}, json.dumps(GOOD).encode())
    )
    assert lane.served == served + 1  # the lane answered it itself, from the policy
    assert by_lane.status == 403
    assert by_lane.body == restricted_message(_key("inference")[0])
    _assert_same(by_lane, by_aiohttp)
    # With its header, the lane serves it (it no longer hands every connection over).
    (answer,) = exchange(
        guarded.http_port,
        (raw_request(INFER, dict([_key("inference")]), json.dumps(GOOD).encode()), False),
    )
    assert answer.status == 200
    assert lane.served == served + 2


def test_a_declared_body_over_the_limit_is_the_same_413_from_either_door(
    guarded: RunningAgent,
) -> None:
    request = raw_request(INFER, dict([_key("inference")]), b"", declared=MAX_BYTES + 1)
    by_lane, by_aiohttp = _by_lane_and_by_aiohttp(guarded.http_port, request)
    assert by_lane.status == 413
    assert by_lane.closed
    _assert_same(by_lane, by_aiohttp)


def test_a_body_arriving_at_the_stop_is_the_same_503_from_either_door(model_repo: Path) -> None:
    with running_agent(_config(model_repo)) as agent:
        agent.http_app[HTTP_POLICY].begin_stop()
        request = raw_request(INFER, dict([_key("inference")]), b"{", declared=100)
        by_lane, by_aiohttp = _by_lane_and_by_aiohttp(agent.http_port, request)
    assert by_lane.status == 503
    _assert_same(by_lane, by_aiohttp)


# ---- the policy's decisions, alone ----


def _policy(*specs: str) -> HttpPolicy:
    return HttpPolicy(
        max_request_bytes=100,
        body_timeout_s=ConnectionLimits().body_timeout_s,
        access=ApiAccess(http=parse_restrictions(specs)),
    )


def test_a_restricted_group_is_refused_before_the_body_length() -> None:
    policy = _policy("inference:k=v")
    refusal = policy.refusal("POST", INFER_ROUTE, {}, 10_000)
    assert refusal is not None
    assert refusal.message == "This API is restricted, expecting header 'k'"
    too_large = policy.refusal("POST", INFER_ROUTE, {"k": "v"}, 10_000)
    assert isinstance(too_large, PayloadTooLargeError)
    assert "over the limit of 100 bytes" in too_large.message
    assert policy.refusal("POST", INFER_ROUTE, {"k": "v"}, 100) is None


def test_head_is_judged_as_get_and_no_route_meets_no_group() -> None:
    policy = _policy("health:k=v")
    assert policy.refusal("HEAD", "/v2/health/live", {}, None) is not None
    assert policy.refusal("GET", "/v2/health/live", {"k": "v"}, None) is None
    assert policy.refusal("GET", None, {}, None) is None  # aiohttp's 404/405
    assert isinstance(policy.refusal("GET", None, {}, 101), PayloadTooLargeError)


def test_the_stop_is_the_policys_to_say() -> None:
    policy = _policy()
    assert not policy.stopping
    assert policy.stopped_body() is None
    policy.begin_stop()
    assert policy.stopping
    assert isinstance(policy.stopped_body(), StoppingError)
