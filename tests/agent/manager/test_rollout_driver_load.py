"""The rollout driver under a simulated fleet on a real Mosquitto: what it stores and when,
telemetry only while a wave soaks, and the inventory it starts from when the broker is slow to
deliver the retained statuses."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agent.manager.rollout import Rollout
from agent.manager.rollout_driver import FleetConnection, drive
from agent.manager.rollout_plan import RolloutSpec
from agent.manager.rollout_store import RolloutStore
from bench.fleet_sim import SimConfig, Simulator
from bench.sim_device import Profile
from tests.mqtt_support import Broker

DEVICES = 40


class CountingStore(RolloutStore):
    """The real store, counting what the driver asks of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saves = 0
        self.with_events = 0

    def save(self, rollout: Rollout, now: float) -> list[dict[str, Any]]:
        self.saves += 1
        self.with_events += bool(rollout.events)
        return super().save(rollout, now)


class RecordingConnection(FleetConnection):
    """The real connection, recording the ticks and each change of the telemetry subscription."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.ticks = 0
        self.subscription: list[tuple[str, bool]] = []
        self.rollout: Rollout | None = None

    def drain(self, rollout: Rollout | None) -> None:
        self.ticks += rollout is not None
        self.rollout = rollout
        super().drain(rollout)

    def want_telemetry(self, wanted: bool) -> None:
        if wanted != self.telemetry_wanted and self.rollout is not None:
            self.subscription.append((self.rollout.phase, wanted))
        super().want_telemetry(wanted)


def test_the_driver_stores_at_decisions_and_listens_to_telemetry_only_while_soaking(
    broker: Broker, tmp_path: Path
) -> None:
    async def scenario() -> tuple[Rollout, CountingStore, RecordingConnection, Simulator, float]:
        config = SimConfig(devices=DEVICES, brokers=(("127.0.0.1", broker.port),),
                           telemetry_s=0.3)  # fmt: skip
        simulator = Simulator(config, Profile())
        await simulator.start()
        store = CountingStore(tmp_path / "rollouts.sqlite")
        try:
            await simulator.wait_ready(30)
            conn = RecordingConnection(broker.settings(), "edge", name="rollout-load")
            async with conn:
                await conn.settle(0.5)
                assert len(conn.fleet.devices) == DEVICES
                spec = RolloutSpec("load", "m", 2, "fleet", waves=(0.1, 0.5, 1.0),
                                   gate="p95_ms<=50", soak_s=1.0)  # fmt: skip
                now = time.time()
                store.create(Rollout.start(spec, conn.fleet.devices, now), now)
                started = time.monotonic()
                async with asyncio.timeout(60):
                    final = await drive(conn, store, "load", tick_s=0.05, save_every_s=1.0)
                took = time.monotonic() - started
            return final, store, conn, simulator, took
        finally:
            store.close()
            await simulator.stop()

    final, store, conn, simulator, took = asyncio.run(scenario())
    assert final.phase == "succeeded"
    assert {d.serving for d in simulator.devices.values()} == {2}
    # Every decision was stored with its state; between decisions, about once a second.
    events = {"wave_deployed", "gate_passed", "wave_started", "rollout_succeeded"}
    assert store.with_events >= 3
    assert store.saves <= store.with_events + 3 + took / 1.0 + 2
    assert store.saves < conn.ticks / 3, (store.saves, conn.ticks)
    stored = RolloutStore(tmp_path / "rollouts.sqlite")
    try:
        kinds = [e["event"] for _n, e in stored.events("load")]
    finally:
        stored.close()
    assert events <= set(kinds)
    assert kinds.count("gate_passed") == 3
    # Subscribed for each of the three soaks, and only then.
    assert conn.subscription[:2] == [("soaking", True), ("running", False)]
    assert [w for _phase, w in conn.subscription].count(True) == 3
    assert all((phase == "soaking") == wanted for phase, wanted in conn.subscription)
