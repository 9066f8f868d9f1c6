"""Failures isolated, never silent: a broken outbox, loop or event sink never breaks serving or a
hot swap; the retained status says `degraded` with the reason until it recovers, and faults the
agent survives reach the fleet as events."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlite_utils import Database

from agent.fleet.outbox import Outbox
from agent.manager.cli import FleetClient
from agent.models.registry import ModelRegistry
from agent.wire.mqtt import Message
from agent.wire.sqlite import StoreError
from tests.mqtt_support import (
    AgentThread,
    Broker,
    LinkFactory,
    agent_config,
    build_cache,
    first,
    is_kind,
    mqtt_config,
)
from tests.server import running_agent
from tests.support import infer_mlp as infer


@contextmanager
def read_only(outbox: Outbox, path: Path) -> Iterator[None]:
    """The outbox's database reopened read-only: every write fails as on a read-only disk."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    with outbox._lock:
        real, outbox._db = outbox._db, Database(conn)
    try:
        yield
    finally:
        with outbox._lock:
            outbox._db = real
        conn.close()


def has_fault(part: str) -> Any:
    """Matches a status message that reports `part` failing."""

    def match(_message: Message, doc: Mapping[str, Any]) -> bool:
        return doc.get("kind") == "status" and part in doc.get("faults", {})

    return match


def model_keys(registry: ModelRegistry) -> set[tuple[str, str]]:
    """The memory reservations of model m (one per loaded build of a version)."""
    assert registry.ledger is not None
    return {key for key in registry.ledger.reserved() if key[0] == "m"}


def served_versions(registry: ModelRegistry) -> list[list[int]]:
    return [sorted(s.versions) for s in registry.served_models()]


def test_read_only_outbox_during_a_hot_swap(
    broker: Broker, start_link: LinkFactory, served: AgentThread, tmp_path: Path
) -> None:
    state = tmp_path / "fleet.sqlite"
    link = start_link(mqtt_config(broker, telemetry_interval_ms=100), state)
    assert link.outbox is not None
    outbox, registry, cache = link.outbox, served.agent.registry, served.agent.model_cache
    assert cache is not None
    port = served.agent.http_port
    old = model_keys(registry)
    assert len(old) == 1

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev1")
            stream = fleet.messages()
            await first(stream, is_kind("status", state="online"))
            with read_only(outbox, state):
                swapped = await fleet.send("dev1", "activate", {"model": "m", "version": 2})
                assert swapped["ok"], swapped  # the swap completes
                assert (await asyncio.to_thread(infer, port))[0] == "2"
                assert served_versions(registry) == [[2]]
                new = model_keys(registry)
                assert len(new) == 1
                assert not new & old  # the old version was released: its memory is back
                # The forwarder may fail first (deleting a sent row); the outbox's own fault
                # comes with the swap's event at the latest.
                degraded = await first(stream, has_fault("outbox"))
                assert degraded["state"] == "degraded"
                assert "readonly database" in degraded["faults"]["outbox"]
                assert "outbox: " in degraded["reason"]
                assert degraded["models"] == [{"name": "m", "versions": [2]}]
            # Writable again: the next telemetry row goes in, and the status says so.
            back = await first(stream, is_kind("status", state="online"))
            assert "faults" not in back
            assert "reason" not in back
            await first(stream, is_kind("telemetry"))
            # The cache's own event log, the authoritative one, kept the swap.
            kinds = [(e.kind, e.version) for e in cache.events()]
            assert ("version_activated", 2) in kinds
            rolled = await fleet.send("dev1", "rollback", {"model": "m"})
            assert rolled["ok"], rolled
            await first(stream, is_kind("event", event="version_activated", version=1))

    asyncio.run(scenario())


def test_failing_loop_restarts_with_backoff_and_status_recovers(
    broker: Broker, start_link: LinkFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = start_link(mqtt_config(broker, telemetry_interval_ms=100))
    assert link.outbox is not None
    calls: list[float] = []

    def broken(_limit: int) -> NoReturn:
        calls.append(time.monotonic())
        raise StoreError("outbox: disk I/O error")

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev1")
            stream = fleet.messages()
            await first(stream, is_kind("status", state="online"))
            monkeypatch.setattr(link.outbox, "take", broken)
            degraded = await first(stream, has_fault("outbox forwarder loop"))
            assert degraded["state"] == "degraded"
            assert degraded["faults"] == {
                "outbox forwarder loop": "StoreError: outbox: disk I/O error"
            }
            async with asyncio.timeout(20):
                while len(calls) < 4:  # restarted, again and again
                    await asyncio.sleep(0.02)
            # Exponential backoff from the reconnect minimum (0.1 s): 0.1 + 0.2 + 0.4 at least.
            assert calls[3] - calls[0] >= 0.69, calls
            pong = await fleet.send("dev1", "ping")  # commands do not need the forwarder
            assert pong["ok"]
            monkeypatch.undo()
            await first(stream, is_kind("status", state="online"))
            await first(stream, is_kind("telemetry"))  # forwarding resumed

    asyncio.run(scenario())


class Broken:
    """An event sink of the agent that fails (a full disk) until repaired."""

    def __init__(self) -> None:
        self.broken = True

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        if self.broken:
            raise OSError(28, "No space left on device")


def test_failing_event_sink_makes_the_link_degraded_not_the_swap(
    broker: Broker, start_link: LinkFactory, served: AgentThread
) -> None:
    sink = Broken()
    served.events.add(sink)
    try:
        start_link(mqtt_config(broker))
        registry, dp = served.agent.registry, served.agent.dataplane

        async def scenario() -> None:
            async with FleetClient(broker.settings()) as fleet:
                await fleet.watch("dev1")
                stream = fleet.messages()
                await first(stream, is_kind("status", state="online"))
                old = model_keys(registry)
                await asyncio.to_thread(served.run, dp.activate_version("m", 2))
                assert served_versions(registry) == [[2]]
                assert not model_keys(registry) & old
                degraded = await first(stream, is_kind("status", state="degraded"))
                assert degraded["faults"] == {
                    "event sink Broken": "OSError: [Errno 28] No space left on device"
                }
                # The other sinks had the event.
                await first(stream, is_kind("event", event="version_activated", version=2))
                sink.broken = False
                await asyncio.to_thread(served.run, dp.rollback("m", None))
                await first(stream, is_kind("status", state="online"))

        asyncio.run(scenario())
    finally:
        served.events.remove(sink)


def test_unexpected_command_error_answers_internal(broker: Broker, start_link: LinkFactory) -> None:
    async def failing_sync() -> Mapping[str, Any]:
        raise RuntimeError("boom")

    start_link(mqtt_config(broker), sync=failing_sync)

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            response = await fleet.send("dev1", "sync")
            assert response["ok"] is False
            assert response["error"] == {
                "code": "internal",
                "message": "internal error: RuntimeError: boom",
            }
            assert (await fleet.send("dev1", "ping"))["ok"]

    asyncio.run(scenario())


def test_corrupt_canary_state_at_start_up_reaches_the_fleet(broker: Broker, tmp_path: Path) -> None:
    cache = build_cache(tmp_path / "agent")
    (cache / "canary.json").write_text('{"schema": 1, "models": {"m": {"versions": "x"}}}')
    config = dataclasses.replace(agent_config(cache), mqtt=mqtt_config(broker, device_id="dev9"))

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev9")  # before the agent starts: events are not retained
            stream = fleet.messages()
            with running_agent(config) as agent:
                assert agent.fleet is not None
                event = await first(stream, is_kind("event", event="canary_state_corrupt"))
                assert event["detail"]["path"] == str(cache / "canary.json")
                assert "invalid content" in event["detail"]["reason"]
                assert (await asyncio.to_thread(infer, agent.http_port))[0] == "1"

    asyncio.run(scenario())
