"""Canary commands over a real broker: start, status, automatic promotion, stop, error codes."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.manager.cli import FleetClient
from tests.models import scale_model, write_versions
from tests.mqtt_support import (
    AgentThread,
    Broker,
    LinkFactory,
    agent_thread,
    first,
    is_kind,
    mqtt_config,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    """Model m serving versions 1 and 2 (both READY) from a plain repository."""
    repo = tmp_path_factory.mktemp("canary") / "models"
    write_versions(repo, "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with agent_thread(config) as running:
        yield running


def infer(port: int) -> str:
    """One unversioned request; returns the version that served it."""
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/m/infer", data=json.dumps(doc).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.loads(resp.read())["model_version"])


def test_canary_commands(broker: Broker, start_link: LinkFactory, served: AgentThread) -> None:
    start_link(mqtt_config(broker))
    port = served.agent.http_port
    policy = {"model": "m", "version": 2, "share": 0.5, "window": 5, "promote_after": 5}

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev1")
            events = fleet.messages()
            bad = await fleet.send("dev1", "canary_start", {**policy, "share": 1.5})
            assert bad["error"]["code"] == "bad_command"
            assert "share must be in (0, 1)" in bad["error"]["message"]
            missing = await fleet.send("dev1", "canary_start", {**policy, "version": 7})
            assert missing["error"]["code"] == "not_found"
            started = await fleet.send("dev1", "canary_start", policy)
            assert started["ok"], started
            assert (started["result"]["state"], started["result"]["baseline"]) == ("RUNNING", 1)
            again = await fleet.send("dev1", "canary-start", policy)
            assert again["error"]["code"] == "conflict"
            await first(events, is_kind("event", event="canary_started", model="m"))
            for _ in range(200):  # ~10 expected: five good candidate requests at share 0.5
                await asyncio.to_thread(infer, port)
                status = await fleet.send("dev1", "canary_status", {"model": "m"})
                if status["result"]["state"] != "RUNNING":
                    break
            assert status["result"]["state"] == "PROMOTED"
            promoted = await first(events, is_kind("event", event="canary_promoted", model="m"))
            detail = promoted["detail"]
            assert (detail["good_requests"], detail["errors"], detail["requests"]) == (5, 0, 5)
            assert detail["reason"].startswith("5 good requests")
            assert {await asyncio.to_thread(infer, port) for _ in range(10)} == {"2"}
            stopped = await fleet.send("dev1", "canary_stop", {"model": "m"})
            assert stopped["result"]["pinned_version"] is None  # the pin is dropped
            none_left = await fleet.send("dev1", "canary_stop", {"model": "m"})
            assert none_left["error"]["code"] == "not_found"

    asyncio.run(scenario())


def test_canary_command_arguments_checked(broker: Broker, start_link: LinkFactory) -> None:
    start_link(mqtt_config(broker))

    async def scenario() -> list[dict[str, Any]]:
        async with FleetClient(broker.settings()) as fleet:
            return [
                await fleet.send("dev1", "canary_start", {"model": "m", "share": 0.1}),
                await fleet.send("dev1", "canary_stop", {"model": "m", "version": 2}),
                await fleet.send("dev1", "canary_status", {"model": "nosuch"}),
            ]

    no_version, extra, unknown = asyncio.run(scenario())
    assert no_version["error"]["code"] == "bad_command"
    assert "'version' is required" in no_version["error"]["message"]
    assert extra["error"]["code"] == "bad_command"
    assert unknown["error"]["code"] == "not_found"
