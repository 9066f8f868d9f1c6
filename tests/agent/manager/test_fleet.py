"""Every fleet command round-trips through a real broker and changes the agent as it says."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.manager import cli as fleet_cli
from agent.manager.cli import FleetClient
from tests.mqtt_support import AgentThread, Broker, LinkFactory, first, is_kind, mqtt_config
from tests.support import infer_mlp


def test_status_ping_and_retained_online(broker: Broker, start_link: LinkFactory) -> None:
    start_link(mqtt_config(broker))

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev1")
            stream = fleet.messages()
            status = await first(stream, is_kind("status", state="online"))
            assert status["schema"] == 1
            assert status["models"] == [{"name": "m", "versions": [1]}]
            assert status["mqtt"] == "5"
            pong = await fleet.send("dev1", "ping")
            assert pong["ok"] is True
            assert pong["result"] == {"pong": True}
            again = await fleet.send("dev1", "status")
            assert again["result"]["models"] == [{"name": "m", "versions": [1]}]
            telemetry = await first(stream, is_kind("telemetry"))
            model = telemetry["models"][0]
            assert {"requests", "failures", "latency_us", "queue_us", "mean_batch_size"} <= set(
                model
            )
            assert telemetry["memory"]["budget_bytes"] > 0
            assert telemetry["cache_disk_bytes"] > 0

    asyncio.run(scenario())


def test_sync_not_configured_and_injected(broker: Broker, start_link: LinkFactory) -> None:
    start_link(mqtt_config(broker))
    calls: list[int] = []

    async def fake_sync() -> Mapping[str, Any]:
        calls.append(1)
        return {"installed": [["m", 3]]}

    async def scenario(expect_ok: bool) -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            response = await fleet.send("dev2" if expect_ok else "dev1", "sync")
            assert response["ok"] is expect_ok
            return response

    missing = asyncio.run(scenario(False))
    assert missing["error"]["code"] == "not_allowed"
    assert "sync is not configured" in missing["error"]["message"]
    start_link(mqtt_config(broker, device_id="dev2"), sync=fake_sync)
    done = asyncio.run(scenario(True))
    assert done["result"] == {"installed": [["m", 3]]}
    assert calls == [1]


def test_set_desired_survives_restart(
    broker: Broker, start_link: LinkFactory, served: AgentThread, tmp_path: Path
) -> None:
    told: list[tuple[str, ...]] = []
    state = tmp_path / "desired.sqlite"
    link = start_link(mqtt_config(broker), state, on_desired=told.append)
    models = {"m": "2", "*": "latest"}

    async def set_it() -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            return await fleet.send("dev1", "set-desired", {"models": models})

    response = asyncio.run(set_it())
    assert response["ok"], response
    assert told == [(), ("*=latest", "m=2")]
    served.run(link.stop())
    told.clear()
    start_link(mqtt_config(broker), state, on_desired=told.append)
    assert told == [("*=latest", "m=2")]

    async def status() -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            return await fleet.send("dev1", "status")

    assert asyncio.run(status())["result"]["desired"] == models


def test_model_commands(broker: Broker, start_link: LinkFactory, served: AgentThread) -> None:
    start_link(mqtt_config(broker))
    port = served.agent.http_port

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("dev1")
            events = fleet.messages()
            unloaded = await fleet.send("dev1", "unload", {"model": "m"})
            assert unloaded["ok"], unloaded
            assert served.agent.registry.served_models() == []
            await first(events, is_kind("event", event="model_unloaded", model="m"))
            loaded = await fleet.send("dev1", "load", {"model": "m"})
            assert loaded["ok"], loaded
            assert loaded["result"]["strategy"] == "load"
            assert (await asyncio.to_thread(infer_mlp, port))[0] == "1"
            swapped = await fleet.send("dev1", "activate", {"model": "m", "version": 2})
            assert swapped["ok"], swapped
            assert (await asyncio.to_thread(infer_mlp, port))[0] == "2"
            event = await first(events, is_kind("event", event="version_activated", version=2))
            assert event["detail"]["versions"] == [2]
            back = await fleet.send("dev1", "rollback", {"model": "m"})
            assert back["result"]["version"] == 1
            assert (await asyncio.to_thread(infer_mlp, port))[0] == "1"
            missing = await fleet.send("dev1", "activate", {"model": "m", "version": 9})
            assert missing["error"]["code"] == "not_found"
            assert (await asyncio.to_thread(infer_mlp, port))[0] == "1"

    asyncio.run(scenario())


def test_set_batching(broker: Broker, start_link: LinkFactory, served: AgentThread) -> None:
    start_link(mqtt_config(broker))
    args = {"model": "m", "max_batch_size": 2, "max_queue_delay_us": 700}

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with FleetClient(broker.settings()) as fleet:
            good = await fleet.send("dev1", "set-batching", args)
            bad = await fleet.send("dev1", "set-batching", {"model": "m", "max_batch_size": 99})
            return good, bad

    good, bad = asyncio.run(scenario())
    assert good["ok"], good
    assert good["result"]["versions"][0]["max_batch_size"] == 2
    policy = served.agent.registry.served_models()[0].versions[1].scheduler.policy
    assert (policy.max_batch_size, policy.max_queue_delay_us) == (2, 700)
    assert bad["error"]["code"] == "invalid_argument"
    assert "over the model's 4" in bad["error"]["message"]


def test_duplicate_id_answered_not_executed(broker: Broker, start_link: LinkFactory) -> None:
    calls: list[int] = []

    async def counting_sync() -> Mapping[str, Any]:
        calls.append(1)
        return {"cycle": len(calls)}

    start_link(mqtt_config(broker), sync=counting_sync)

    async def scenario() -> list[dict[str, Any]]:
        async with FleetClient(broker.settings()) as fleet:
            return [await fleet.send("dev1", "sync", command_id="sync-1") for _ in range(3)]

    first_reply, *again = asyncio.run(scenario())
    assert calls == [1]
    assert first_reply["result"] == {"cycle": 1}
    assert "duplicate" not in first_reply
    for reply in again:
        assert reply["duplicate"] is True
        assert reply["result"] == {"cycle": 1}
        assert reply["id"] == "sync-1"


def test_slo_breach_event(broker: Broker, start_link: LinkFactory, served: AgentThread) -> None:
    """A p95 target no request can meet: the next telemetry tick publishes a breach event."""
    start_link(mqtt_config(broker, device_id="slo", slo=("m:p95_ms=0.001,min_requests=3",)))

    async def scenario() -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("slo")
            for _ in range(5):
                await asyncio.to_thread(infer_mlp, served.agent.http_port)
            return await first(fleet.messages(), is_kind("event", event="slo_breach"))

    breach = asyncio.run(scenario())
    assert breach["model"] == "m"
    assert breach["detail"]["metric"] == "p95_ms"
    assert breach["detail"]["observed"] > breach["detail"]["target"] == 0.001
    assert breach["detail"]["requests"] >= 3


def test_fleet_cli_send_and_watch(broker: Broker, start_link: LinkFactory) -> None:
    start_link(mqtt_config(broker, device_id="cli"))
    parser = argparse.ArgumentParser(prog="edge-agent")
    fleet_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    common = ["--host", "127.0.0.1", "--port", str(broker.port)]

    out = io.StringIO()
    args = parser.parse_args(["fleet", "send", "cli", "rollback", "model=m", "version=9", *common])
    assert fleet_cli.run(args, out=out) == fleet_cli.EXIT_FAILED
    assert json.loads(out.getvalue())["error"]["code"] == "not_found"

    out = io.StringIO()
    args = parser.parse_args(["fleet", "send", "cli", "ping", "--id", "cli-1", *common])
    assert fleet_cli.run(args, out=out) == fleet_cli.EXIT_OK
    assert json.loads(out.getvalue())["id"] == "cli-1"

    out = io.StringIO()
    args = parser.parse_args(["fleet", "watch", "cli", "--count", "2", *common])
    assert fleet_cli.run(args, out=out) == fleet_cli.EXIT_OK
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("edge/cli/status online m:[1]")  # the retained status first
    assert lines[1].startswith("edge/cli/")

    args = parser.parse_args(["fleet", "send", "nobody", "ping", "--timeout", "0.5", *common])
    assert fleet_cli.run(args, out=io.StringIO(), err=io.StringIO()) == fleet_cli.EXIT_TIMEOUT
