"""Malformed and hostile commands each get an error response; the agent keeps serving."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent.manager.cli import FleetClient
from tests.mqtt_support import AgentThread, Broker, LinkFactory, mqtt_config
from tests.support import infer_mlp

HOSTILE: list[tuple[bytes, str, str]] = [
    (b"{not json", "bad_command", "not valid JSON"),
    (b"\xff\xfe\x00", "bad_command", "not valid JSON"),
    (b"[1, 2, 3]", "bad_command", "JSON object"),
    (b'{"command": "ping"}', "bad_command", "'id'"),
    (b'{"id": "../../etc", "command": "ping"}', "bad_command", "'id'"),
    (b"[" * 100_000 + b"]" * 100_000, "too_large", "over the"),
    (b'{"id": "x1", "command": "format-disk"}', "bad_command", "unknown command"),
    (b'{"id": "x2", "command": "ping", "schema": 7}', "bad_command", "unsupported schema"),
    (b'{"id": "x3", "command": "ping", "extra": 1}', "bad_command", "unknown command key"),
    (b'{"id": "x4", "command": "activate", "args": {"model": "m"}}', "bad_command", "'version'"),
    (
        b'{"id": "x5", "command": "activate", "args": {"model": "m", "version": "2"}}',
        "bad_command",
        "integer",
    ),
    (
        b'{"id": "x6", "command": "load", "args": {"model": "../../etc/passwd"}}',
        "bad_command",
        "model name",
    ),
    (b'{"id": "x7", "command": "unload", "args": {"model": "m", "rm": true}}', "bad_command", "rm"),
    (
        b'{"id": "x8", "command": "set-desired", "args": {"models": {"m": "oldest"}}}',
        "bad_command",
        "policy",
    ),
    (b'{"id": "x9", "command": "set-batching", "args": {"model": "m"}}', "bad_command", "at least"),
    (b'{"id": "xa", "command": "load", "args": {"model": "nope"}}', "not_found", "nope"),
]


@pytest.fixture
def link(broker: Broker, start_link: LinkFactory) -> None:
    start_link(mqtt_config(broker, max_command_bytes=4096))


@pytest.mark.usefixtures("link")
def test_hostile_commands_get_error_responses(broker: Broker, served: AgentThread) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with FleetClient(broker.settings()) as fleet, asyncio.timeout(30):
            replies = [await fleet.send("dev1", "ping", raw=raw) for raw, _, _ in HOSTILE]
            replies.append(await fleet.send("dev1", "ping"))
            return replies

    *errors, pong = asyncio.run(scenario())
    for (raw, code, text), reply in zip(HOSTILE, errors, strict=True):
        assert reply["ok"] is False, raw[:60]
        assert reply["error"]["code"] == code, (raw[:60], reply)
        assert text in reply["error"]["message"], (raw[:60], reply)
    assert errors[6]["id"] == "x1"  # the id is echoed whenever it could be read
    assert errors[0]["id"] is None
    assert pong["ok"] is True
    assert infer_mlp(served.agent.http_port)[0] == "1"


@pytest.mark.usefixtures("link")
def test_reply_topic_cannot_target_device_topics(broker: Broker) -> None:
    """A response topic naming the device's own status topic is ignored (default topic used)."""

    async def scenario() -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet, asyncio.timeout(20):
            await fleet.subscribe("edge/dev1/responses")
            await fleet.subscribe("edge/dev1/status")
            await fleet.client.publish(
                "edge/dev1/commands",
                json.dumps({"id": "r1", "command": "ping"}).encode(),
                response_topic="edge/dev1/status",
            )
            async for message in fleet.messages():
                doc = json.loads(message.payload)
                if doc.get("id") == "r1":
                    assert message.topic == "edge/dev1/responses"
                    return dict(doc)
        raise AssertionError("no response")

    assert asyncio.run(scenario())["ok"] is True
