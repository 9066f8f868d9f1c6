"""The sync-and-swap loop under failure and under an operator's hand (issue 25), end to end.

Real parts: the agent (HTTP, ONNX Runtime, model cache, fleet link), the S3-protocol server,
a Mosquitto broker, a client sending requests throughout. Sync cycles are driven one by one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConflictError
from agent.manager.cli import FleetClient
from tests.mqtt_support import Broker
from tests.support import wait_until
from tests.sync.rejection_support import Client, Device, device, get_json, infer

pytestmark = pytest.mark.skipif(
    not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()),
    reason="mosquitto is not installed (make test installs it)",
)


@pytest.fixture
def dev(tmp_path: Path, s3_endpoint: str, broker: Broker) -> Iterator[Device]:
    with device(tmp_path, s3_endpoint, broker) as made:
        yield made


def serving(dev: Device) -> str | None:
    return infer(dev.port)[1]


def test_operator_rollback_holds_for_ten_cycles_and_set_desired_lifts_it(
    dev: Device, broker: Broker
) -> None:
    dev.publish(1)
    dev.cycle()
    assert serving(dev) == "1"
    client = Client(dev.port)
    client.start()
    dev.publish(2)
    dev.cycle()
    assert serving(dev) == "2"

    async def send(command: str, args: dict[str, Any]) -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            return await fleet.send("dev1", command, args)

    back = asyncio.run(send("rollback", {"model": "m"}))
    assert back["ok"], back
    assert back["result"]["version"] == 1
    for _ in range(10):
        dev.cycle()
        assert serving(dev) == "1"
    rows = {r["version"]: r for r in get_json(dev.port, "GET", "/v2/repository/models/m/versions")}
    assert rows[2]["rejected"] is True
    assert rows[2]["rejected_cause"] == "rolled-back"
    assert "rolled back to version 1" in rows[2]["rejected_reason"]
    assert rows[1]["rejected"] is False
    index = get_json(dev.port, "POST", "/v2/repository/index", {})
    assert any(
        r.get("version") == "2" and "rejected on this device" in r["reason"] for r in index
    ), index
    status = asyncio.run(send("status", {}))
    assert [(r["version"], r["cause"]) for r in status["result"]["rejected"]] == [
        (2, "rolled-back")
    ]

    lifted = asyncio.run(send("set-desired", {"models": {"*": "latest"}}))
    assert lifted["ok"], lifted
    assert lifted["result"]["cleared"] == {"m": [2]}
    dev.cycle()
    assert serving(dev) == "2"
    seen = client.stop()
    assert seen, "the client sent no request"
    assert all(code == 200 for code, _v in seen), [s for s in seen if s[0] != 200][:3]


def test_fresh_device_with_broken_latest_serves_the_previous_within_two_cycles(
    dev: Device,
) -> None:
    dev.publish(1)
    dev.publish(2, broken=True)
    client = Client(dev.port)
    client.start()
    for _ in range(2):
        dev.cycle()
    assert serving(dev) == "1"
    wait_until(lambda: (200, "1") in client.seen, what="the client served by version 1")
    seen = client.stop()
    assert {v for code, v in seen if code == 200} == {"1"}
    cache = dev.served.agent.model_cache
    assert cache is not None
    [rejected] = cache.rejections.entries("m")
    assert (rejected.version, rejected.cause.value) == (2, "failed")
    assert "onnxruntime cannot load" in rejected.reason
    state = dev.loop.state()
    assert state["serving"]["m"]["version"] == 1
    assert "version(s) [2] rejected" in state["serving"]["m"]["why"]


def test_one_broken_version_is_one_failure_event_over_ten_cycles(
    dev: Device, broker: Broker
) -> None:
    dev.publish(1)
    dev.cycle()
    client = Client(dev.port)
    client.start()
    dev.publish(2, broken=True)

    async def scenario() -> list[dict[str, Any]]:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.subscribe("edge/dev1/events")
            for _ in range(10):
                await asyncio.to_thread(dev.cycle)
            # Events leave in order through the outbox: once the marker arrives, all did.
            dev.served.events.record("m", None, "test_marker", {})
            got: list[dict[str, Any]] = []
            async with asyncio.timeout(20):
                async for message in fleet.messages():
                    doc = json.loads(message.payload)
                    if doc.get("event") == "test_marker":
                        return got
                    got.append(doc)
        raise AssertionError("no marker")

    events = asyncio.run(scenario())
    failures = [e for e in events if e["event"] in ("swap_failed", "load_failed", "sync_failing")]
    assert len(failures) == 1, failures
    assert failures[0]["event"] == "swap_failed"
    assert failures[0]["version"] == 2
    assert failures[0]["detail"]["serving"] == [1]
    assert "onnxruntime cannot load" in failures[0]["detail"]["reason"]
    assert serving(dev) == "1"
    seen = client.stop()
    assert all(s == (200, "1") for s in seen), [s for s in seen if s != (200, "1")][:3]


def test_newer_good_version_after_a_rejected_one_is_activated(dev: Device) -> None:
    dev.publish(1)
    dev.cycle()
    client = Client(dev.port)
    client.start()
    dev.publish(2, broken=True)
    dev.cycle()
    assert serving(dev) == "1"
    dev.publish(3)
    dev.cycle()
    assert serving(dev) == "3"
    seen = client.stop()
    assert set(seen) <= {(200, "1"), (200, "3")}, [s for s in seen if s[0] != 200][:3]
    rows = {r["version"]: r for r in get_json(dev.port, "GET", "/v2/repository/models/m/versions")}
    assert rows[2]["rejected"] is True
    assert rows[3]["state"] == "active"
    versions = dev.served.agent.dataplane.versions
    assert versions is not None
    with pytest.raises(ConflictError, match="rejected on this device"):  # the sync's own path
        dev.served.run(versions.activate("m", 2))
    # An operator's activate lifts the rejection, tries, and the failure rejects it again.
    failed = get_json(dev.port, "POST", "/v2/repository/models/m/versions/2/activate", {})
    assert "onnxruntime cannot load" in failed["error"]
    assert serving(dev) == "3"
    cache = dev.served.agent.model_cache
    assert cache is not None
    assert [(r.version, r.cause.value) for r in cache.rejections.entries("m")] == [(2, "failed")]
    cleared = get_json(dev.port, "POST", "/v2/repository/models/m/clear-rejected", {"version": 2})
    assert cleared == {"model": "m", "cleared": [2]}
    assert [e[1] for e in dev.kinds("swap_failed")] == [2, 2]  # the sync's try, the operator's
