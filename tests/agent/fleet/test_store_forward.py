"""The broker goes away under load and comes back: nothing is lost but counted drops."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agent.manager.cli import FleetClient
from tests.mqtt_support import AgentThread, Broker, LinkFactory, mqtt_config
from tests.support import infer_mlp, wait_until_async


def latest_telemetry(got: list[dict[str, Any]]) -> dict[str, Any]:
    return max((d for d in got if d["kind"] == "telemetry"), key=lambda d: int(d["seq"]))


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
            await wait_until_async(
                lambda: any(d["kind"] == "telemetry" for d in got), "telemetry", timeout_s=20
            )

            await asyncio.to_thread(broker.stop)
            await wait_until_async(
                lambda: link.client is not None and not link.client.connected,
                "the link down",
                timeout_s=10,
            )
            port = served.agent.http_port
            versions = [await asyncio.to_thread(infer_mlp, port) for _ in range(20)]
            assert {v for v, _ in versions} == {"1"}  # serving does not need the broker
            await asyncio.to_thread(served.run, dp.unload_model("m"))
            await asyncio.to_thread(served.run, dp.load_model("m", None))
            await wait_until_async(
                lambda: outbox.stats().dropped_telemetry >= 3, "telemetry dropped", timeout_s=20
            )

            restarted = time.time()
            await asyncio.to_thread(broker.start)
            await wait_until_async(
                lambda: any(d["kind"] == "telemetry" and d["ts"] > restarted for d in got),
                "telemetry after the restart",
                timeout_s=30,
            )
            # Every drop happened while disconnected, to a row older than this one.
            newest = outbox.stats().last_seq
            await wait_until_async(
                lambda: max(d.get("seq", 0) for d in got) >= newest,
                "drained in order",
                timeout_s=20,
            )
            stats = outbox.stats()
            # Telemetry reports the counters as they were when it was made: a later one says so.
            await wait_until_async(
                lambda: any(
                    d["kind"] == "telemetry" and d["outbox"] == {**d["outbox"], **{
                        "dropped_telemetry": stats.dropped_telemetry, "dropped_events": 0}}
                    for d in got
                ),
                "the drop count reported",
                timeout_s=20,
            )  # fmt: skip
            # Resumed telemetry reports live counters: requests made now show up in it.
            base = latest_telemetry(got)["models"][0]["requests"]
            for _ in range(3):
                await asyncio.to_thread(infer_mlp, port)
            await wait_until_async(
                lambda: any(
                    d["kind"] == "telemetry" and d["models"][0]["requests"] == base + 3 for d in got
                ),
                f"telemetry counting {base + 3} requests",
                timeout_s=20,
            )
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
        assert latest_telemetry(got)["ts"] > restarted  # telemetry resumed

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()
