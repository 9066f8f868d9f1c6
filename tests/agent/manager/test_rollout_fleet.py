"""Fleet scale: 20 real agents on one Mosquitto, inventory, staged rollouts, kill -9 of the
manager mid-rollout, a bad version aborted and rolled back, and two exporters sharing the fleet.

The figures (time per wave, messages, devices reached) are printed (`pytest -s` shows them).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.manager.exporter import Exporter
from agent.manager.rollout_plan import target_order
from tests.fleet_support import (
    Device,
    RabbitBroker,
    elapsed,
    fleet_cli,
    fleet_process,
    rabbitmq_missing,
    run_fleet,
    table,
)
from tests.mqtt_support import Broker
from tests.support import wait_until

N = 20
NAMES = [f"dev{i:02d}" for i in range(N)]
GROUPS = {n: ("site-a" if i % 2 else "site-b", "orin") for i, n in enumerate(NAMES)}
BAD_ROLLOUT = "m-v3"
# Version 3 fails to load on the second device its rollout reaches, and on two more.
BROKEN = {target_order(BAD_ROLLOUT, NAMES)[i] for i in (1, 7, 13)}


@pytest.fixture(scope="module", params=["mosquitto", "rabbitmq"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "rabbitmq":
        missing = rabbitmq_missing()
        if missing:
            print(f"\nskipped: {missing}")
            pytest.skip(missing)
        server: Broker = RabbitBroker(folder)
    else:
        server = Broker(folder)
    started = time.monotonic()
    server.start()
    print(f"\n{request.param} started in {elapsed(started)} s")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fleet(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Device]]:
    started = time.monotonic()
    with run_fleet(broker, tmp_path_factory.mktemp("fleet"), GROUPS, BROKEN) as devices:
        print(f"\n{N} agents started in {elapsed(started)} s")
        yield devices


def _events(db: Path, rollout: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT doc FROM rollout_events WHERE rollout = ? ORDER BY n", [rollout]
        ).fetchall()
    return [json.loads(r[0]) for r in rows]


def _phase(db: Path, rollout: str) -> tuple[str, int] | None:
    if not db.exists():
        return None
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT state FROM rollouts WHERE id = ?", [rollout]).fetchone()
    except sqlite3.OperationalError:  # the manager is creating the file
        return None
    if row is None:
        return None
    state = json.loads(row[0])
    return str(state["phase"]), int(state["wave"])


def _figures(title: str, events: list[dict[str, Any]]) -> None:
    rows: list[list[object]] = [["wave", "devices", "deploy_s", "jobs", "not_reached"]]
    for e in events:
        if e["event"] == "wave_deployed":
            rows.append(
                [int(e["wave"]) + 1, e["devices"], e["deploy_s"], e["jobs"], e["not_reached"]]
            )
    print(f"\n{title}\n{table(rows)}")


def test_inventory_lists_groups_versions_and_facts(
    broker: Broker, fleet: dict[str, Device]
) -> None:
    code, out = fleet_cli(broker, "inventory", "--group", "site-a", "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert sorted(r["device"] for r in rows) == sorted(n for n in NAMES if "site-a" in GROUPS[n])
    row = rows[0]
    assert row["state"] == "online"
    assert row["groups"] == ["site-a", "orin"]
    assert row["models"] == {"m": [1]}
    assert row["served"][0]["digest"].startswith("sha256:")
    assert row["inventory"]["python"]
    assert "onnxruntime" in row["inventory"]["packages"]
    code, out = fleet_cli(broker, "send", "dev00", "rebirth")
    assert code == 0, out
    reborn = json.loads(out)["result"]
    assert reborn["groups"] == ["site-b", "orin"]
    assert reborn["inventory"]["agent_version"]
    code, out = fleet_cli(broker, "inventory")
    assert code == 0
    assert len(out.splitlines()) == N + 1
    assert out.splitlines()[0].split()[:3] == ["DEVICE", "STATE", "GROUPS"]


def test_rollout_reaches_all_in_three_waves_across_a_manager_kill(
    broker: Broker, fleet: dict[str, Device], tmp_path: Path
) -> None:
    db = tmp_path / "rollouts.sqlite"
    args = ["rollout", "start", "m", "2", "--group", "orin", "--waves", "10%,50%,100%",
            "--gate", "error_rate<=0.01,p95_ms<=1000", "--soak", "1s", "--db", str(db),
            "--tick", "0.05"]  # fmt: skip
    started = time.monotonic()
    manager = fleet_process(broker, *args, log=tmp_path / "manager.log")
    try:
        # Kill the manager once the second wave is under way (its commands are out or going).
        wait_until(lambda: (_phase(db, "m-v2") or ("", 0))[1] >= 1, "the second wave", timeout_s=60)
        os.kill(manager.pid, signal.SIGKILL)
        manager.wait(10)
    finally:
        if manager.poll() is None:
            manager.kill()
    killed_at = _phase(db, "m-v2")
    code, out = fleet_cli(broker, "rollout", "status", "--db", str(db))
    assert code == 0
    assert "driver: not running" in out
    code, out = fleet_cli(broker, "rollout", "resume", "--db", str(db), "--tick", "0.05")
    total = elapsed(started)
    assert code == 0, out + (tmp_path / "manager.log").read_text()
    assert all(d.serving() == [2] for d in fleet.values())
    events = _events(db, "m-v2")
    kinds = [e["event"] for e in events]
    assert kinds.count("wave_deployed") == 3  # each wave once: nothing lost, nothing repeated
    assert kinds.count("gate_passed") == 3
    assert kinds[-1] == "rollout_succeeded"
    waves = [e for e in events if e["event"] == "wave_deployed"]
    assert [w["devices"] for w in waves] == [2, 10, 20]
    assert all(w["not_reached"] == [] for w in waves)
    _figures(f"rollout m v2 to {N} devices (manager killed at {killed_at}, resumed): "
             f"{total} s in all; {out.splitlines()[-1]}", events)  # fmt: skip
    code, out = fleet_cli(broker, "rollout", "status", "--db", str(db), "--json")
    doc = json.loads(out)
    assert doc["phase"] == "succeeded"
    assert doc["jobs"]["succeeded"] == N


def test_bad_version_aborts_in_first_wave_and_rolls_back(
    broker: Broker, fleet: dict[str, Device], tmp_path: Path
) -> None:
    wait_until(lambda: all(d.serving() == [2] for d in fleet.values()), "v2 everywhere")
    db = tmp_path / "rollouts.sqlite"
    started = time.monotonic()
    code, out = fleet_cli(broker, "rollout", "start", "m", "3", "--group", "orin",
                          "--waves", "10%,50%,100%", "--soak", "1s", "--db", str(db),
                          "--tick", "0.05")  # fmt: skip
    assert code == 1, out
    events = _events(db, BAD_ROLLOUT)
    aborted = next(e for e in events if e["event"] == "aborted")
    first_wave = target_order(BAD_ROLLOUT, NAMES)[:2]
    assert aborted["wave"] == 0
    assert sorted(aborted["rolling_back"]) == sorted(first_wave)
    assert "load_failed" in json.dumps(aborted["failed"])
    done = events[-1]
    assert done["event"] == "rolled_back"
    assert done["succeeded"] == 2
    assert all(d.serving() == [2] for d in fleet.values())  # touched or not: the old version
    took = elapsed(started)
    print(f"\nrollout m v3 (broken on {len(BROKEN)}): aborted in wave 1, rolled back "
          f"{done['succeeded']} devices in {took} s; {out.splitlines()[-1]}")  # fmt: skip


def test_two_exporters_split_the_fleet(broker: Broker, fleet: dict[str, Device]) -> None:
    # On RabbitMQ (3.1.1, no shared subscriptions) each exporter reads all the telemetry and
    # still serves only its devices; the same split is checked there.
    async def scenario(scraped: list[str]) -> tuple[list[str], list[str]]:
        state: object = None
        exporters = [
            Exporter(broker.settings(), "edge", share="exp", name=f"exp{i}", stale_s=30)
            for i in (1, 2)
        ]
        for exporter in exporters:
            await exporter.start()
        try:
            async with asyncio.timeout(30):
                while True:
                    served = [e.metrics.served() for e in exporters]
                    peers = [len(e.metrics.peers) for e in exporters]
                    if peers == [2, 2] and len(set(served[0]) | set(served[1])) == N:
                        registry = CollectorRegistry()
                        registry.register(exporters[0].metrics)
                        scraped.append(generate_latest(registry).decode())
                        return served[0], served[1]
                    state = (peers, served, [sorted(e.metrics.telemetry) for e in exporters])
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(f"exporters: {state}") from None
        finally:
            for exporter in exporters:
                await exporter.stop()

    scraped: list[str] = []
    first, second = asyncio.run(scenario(scraped))
    assert not set(first) & set(second)
    assert sorted(first + second) == NAMES
    assert 4 <= len(first) <= 16
    device = first[0]
    group = GROUPS[device][0]
    assert f'edge_fleet_device_up{{device="{device}",group="{group}"}} 1.0' in scraped[0]
    assert f'edge_fleet_requests_total{{device="{device}",group="{group}",model="m"' in scraped[0]
    assert f'device="{second[0]}"' not in scraped[0]
    print(f"\nexporters: {len(first)} + {len(second)} devices")
