"""TLS with a generated CA: the link connects with mutual TLS; a wrong certificate is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.manager.cli import FleetClient
from agent.wire.mqtt import MqttClient
from tests.mqtt_support import Broker, LinkFactory, Pki, mqtt_config
from tests.support import wait_until_async


@pytest.fixture
def tls_broker(tmp_path: Path, pki: Pki) -> Iterator[Broker]:
    server = Broker(tmp_path / "tls-broker", pki=pki)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_mutual_tls_accepted(tls_broker: Broker, pki: Pki, start_link: LinkFactory) -> None:
    assert tls_broker.tls_port is not None
    config = mqtt_config(
        tls_broker,
        port=tls_broker.tls_port,
        device_id="secure",
        tls_ca=pki.ca,
        tls_cert=pki.client_cert,
        tls_key=pki.client_key,
    )
    start_link(config)

    async def scenario() -> dict[str, Any]:
        settings = tls_broker.settings(
            port=tls_broker.tls_port, tls_ca=pki.ca, tls_cert=pki.client_cert,
            tls_key=pki.client_key,
        )  # fmt: skip
        async with FleetClient(settings) as fleet, asyncio.timeout(20):
            await fleet.watch("secure")
            async for message in fleet.messages():
                doc = json.loads(message.payload)
                if doc.get("kind") == "status":
                    assert doc["state"] == "online"
                    return await fleet.send("secure", "ping")
        raise AssertionError("no status")

    assert asyncio.run(scenario())["ok"] is True


@pytest.mark.parametrize("client", ["rogue", "none"])
def test_wrong_client_certificate_refused(tls_broker: Broker, pki: Pki, client: str) -> None:
    cert, key = (pki.rogue_cert, pki.rogue_key) if client == "rogue" else (None, None)
    settings = tls_broker.settings(
        port=tls_broker.tls_port, tls_ca=pki.ca, tls_cert=cert, tls_key=key
    )
    reasons: list[str] = []
    ups: list[int] = []

    async def scenario() -> MqttClient:
        mqtt = MqttClient(
            settings, on_disconnected=reasons.append, on_connected=lambda: ups.append(1)
        )
        await mqtt.start()
        try:
            # Two refused attempts, with backoff in between.
            await wait_until_async(lambda: mqtt.failures >= 2, "two refused attempts", timeout_s=20)
            assert not mqtt.connected
        finally:
            await mqtt.stop()
        return mqtt

    client_used = asyncio.run(scenario())
    assert client_used.failures >= 2
    assert reasons
    assert ups == []  # never accepted
