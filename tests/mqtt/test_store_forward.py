"""The broker goes away under load and comes back: nothing is lost but counted drops."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agent.cli.fleet import FleetClient
from tests.agent.test_cache_swap import infer
from tests.mqtt.conftest import LinkFactory, mqtt_config
from tests.mqtt.support import AgentThread, Broker


async def until(check: Any, limit: float, what: str) -> None:
    """Poll a condition without blocking the loop (bounded)."""
    async with asyncio.timeout(limit):
        while not check():
            await asyncio.sleep(0.02)
    assert check(), what


def test_broker_outage_during_load(
    tmp_path: Path, served: AgentThread, start_link: LinkFactory
) -> None:
    broker = Broker(tmp_path / "broker", persistence=True)  # sessions survive its restart
    broker.start()
    got: list[dict[str, Any]] = []
    dp = served.agent.dataplane

    async def scenario() -> None:
        observer = broker.settings(client_id="observer", persistent_session=True)
        async with FleetClient(observer) as fleet:
            await fleet.watch("dev1")

            async def collect() -> None:
                async for message in fleet.messages():
                    got.append(json.loads(message.payload))

            collector = asyncio.create_task(collect())
            config = mqtt_config(broker, outbox_max_messages=12, telemetry_interval_ms=100)
            link = await asyncio.to_thread(start_link, config)
            assert link.outbox is not None
            outbox = link.outbox
            await until(lambda: any(d["kind"] == "telemetry" for d in got), 20, "telemetry")

            await asyncio.to_thread(broker.stop)
            await until(lambda: link.client is not None and not link.client.connected, 10, "down")
            versions = [await asyncio.to_thread(infer, served.agent.http_port) for _ in range(20)]
            assert {v for v, _ in versions} == {"1"}  # serving does not need the broker
            await asyncio.to_thread(served.run, dp.unload_model("m"))
            await asyncio.to_thread(served.run, dp.load_model("m", None))
            await until(lambda: outbox.stats().dropped_telemetry >= 3, 20, "telemetry dropped")

            restarted = time.time()
            await asyncio.to_thread(broker.start)
            await until(
                lambda: any(d["kind"] == "telemetry" and d["ts"] > restarted for d in got),
                30,
                "telemetry after the restart",
            )
            # Every drop happened while disconnected, to a row older than this one.
            newest = outbox.stats().last_seq
            await until(lambda: max(d.get("seq", 0) for d in got) >= newest, 20, "drained in order")
            stats = outbox.stats()
            # Telemetry reports the counters as they were when it was made: a later one says so.
            await until(
                lambda: any(
                    d["kind"] == "telemetry" and d["outbox"] == {**d["outbox"], **{
                        "dropped_telemetry": stats.dropped_telemetry, "dropped_events": 0}}
                    for d in got
                ),
                20,
                "the drop count reported",
            )  # fmt: skip
            collector.cancel()

        arrivals: list[int] = []
        for doc in got:
            if "seq" in doc and doc["seq"] not in arrivals:
                arrivals.append(doc["seq"])
        assert arrivals == sorted(arrivals), "delivered out of order"
        missing = set(range(1, newest + 1)) - set(arrivals)
        assert stats.dropped_events == 0
        assert stats.dropped_telemetry > 0
        assert len(missing) == stats.dropped_telemetry, (arrivals, missing, newest)
        events = [d for d in got if d["kind"] == "event"]
        assert [e["event"] for e in events][-2:] == ["model_unloaded", "version_activated"]
        last = max((d for d in got if d["kind"] == "telemetry"), key=lambda d: d["seq"])
        assert last["ts"] > restarted  # telemetry resumed
        assert last["models"][0]["requests"] >= 0

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()
