"""Fixtures: a real Mosquitto broker per test, a PKI, and an agent serving a model cache."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.config import MqttConfig
from agent.fleet.inventory import cache_digests
from agent.fleet.link import FleetLink
from tests.mqtt_support import (
    AgentThread,
    Broker,
    LinkFactory,
    Pki,
    agent_config,
    agent_thread,
    build_cache,
    make_pki,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists():
        return
    skip = pytest.mark.skip(reason="mosquitto is not installed (make test installs it)")
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    server = Broker(tmp_path / "broker")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    cache = build_cache(tmp_path_factory.mktemp("agent"))
    with agent_thread(agent_config(cache)) as running:
        yield running


@pytest.fixture
def start_link(served: AgentThread, tmp_path: Path) -> Iterator[LinkFactory]:
    """Start FleetLinks on the agent's loop (as the daemon will); all stopped at teardown."""
    links: list[FleetLink] = []

    def start(config: MqttConfig, state: Path | None = None, **kw: Any) -> FleetLink:
        agent = served.agent
        if agent.model_cache is not None:
            kw.setdefault("cache_disk", agent.model_cache.disk_usage)
            kw.setdefault("digests", cache_digests(agent.model_cache))
        link = FleetLink(
            config,
            agent.dataplane,
            agent.registry,
            agent.registry.ledger,
            state or tmp_path / "fleet.sqlite",
            **kw,
        )
        served.run(link.start())
        # Commands sent before the broker acknowledged the subscription would be dropped.
        served.run(asyncio.wait_for(link.wait_subscribed(), 20))
        served.events.add(link)
        links.append(link)
        return link

    yield start
    for link in reversed(links):
        served.events.remove(link)
        served.run(link.stop())
