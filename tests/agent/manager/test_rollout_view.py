"""The dashboard's view of the rollouts file: a real rollout's state mapped to waves, jobs and
the gate (pure), and `StoreRollouts` reading a real `RolloutStore` file read-only beside its
writer."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from agent.manager.devices import Fleet
from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import RolloutSpec, target_order
from agent.manager.rollout_store import RolloutStore
from agent.manager.rollout_view import StoreRollouts, rollout_json

NAMES = [f"d{i}" for i in range(10)]


def _fleet() -> Fleet:
    fleet = Fleet()
    for name in NAMES:
        _serve(fleet, name, 1)
    return fleet


def _serve(fleet: Fleet, device: str, version: int) -> None:
    fleet.update({"kind": "status", "device": device, "state": "online", "groups": ["lab"],
                  "models": [{"name": "m", "versions": [version]}]})  # fmt: skip


def _spec(**kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {"id": "r1", "model": "m", "version": 2, "group": "lab",
                            "waves": (0.1, 0.5, 1.0), "gate": "p95_ms<=50,error_rate<=0.01",
                            "soak_s": 5, "job_timeout_s": 30}  # fmt: skip
    return RolloutSpec(**{**base, **kw})


def _advance(fleet: Fleet, rollout: Rollout, now: float, broken: str = "") -> None:
    """One step; the devices do what they are told (`broken` fails to load version 2)."""
    for send in rollout.step(fleet.devices, now):
        version = int(send.args["version"])
        ok = send.device != broken or version != 2
        if ok:
            _serve(fleet, send.device, version)
        error = {} if ok else {"error": {"code": "load_failed", "message": "bad model"}}
        rollout.on_response(send.device, send.command_id, {"ok": ok, **error})


def _telemetry(rollout: Rollout, p95_us: float, requests: int) -> None:
    for name in NAMES:
        served = 2 if rollout.jobs.get(name) and rollout.jobs[name].state == "succeeded" else 1
        model = {"model": "m", "version": served, "requests": requests, "failures": 0,
                 "latency_us": {"p95": p95_us, "p99": p95_us}}  # fmt: skip
        rollout.on_telemetry(name, {"models": [model]})


def test_a_rollout_in_its_second_wave_shows_the_first_passed_with_figures_and_limits() -> None:
    fleet = _fleet()
    rollout = Rollout.start(_spec(), fleet.devices, 0.0)
    now = 0.0
    while rollout.wave == 0:
        _advance(fleet, rollout, now)
        _telemetry(rollout, 4200.0, int(now) * 10)
        now += 1
    doc = rollout_json(rollout.to_json())
    assert {k: doc[k] for k in ("id", "model", "version", "group", "state", "wave")} == {
        "id": "r1",
        "model": "m",
        "version": 2,
        "group": "lab",
        "state": "running",
        "wave": 2,
    }
    first, second, third = doc["waves"]
    order = target_order("r1", NAMES)
    assert first["name"] == "wave 1 (10%)"
    assert first["state"] == "done"
    assert first["devices"] == {order[0]: "succeeded"}
    assert first["gate"]["verdict"] == "pass"
    assert first["gate"]["figures"] == {"p95_ms": 4.2, "error_rate": 0.0}
    assert first["gate"]["limits"] == {"p95_ms": 50.0, "error_rate": 0.01}
    assert first["gate"]["candidate"]["devices"] == 1
    assert first["gate"]["baseline"]["devices"] == 9
    assert second["state"] == "running"
    assert list(second["devices"]) == order[1:5]
    assert set(second["devices"].values()) == {"in_progress"}  # sent, not yet confirmed
    assert second["gate"] == {
        "verdict": "waiting",
        "figures": {},
        "limits": first["gate"]["limits"],
    }
    assert third["state"] == "pending"
    assert set(third["devices"].values()) == {"pending"}


def test_a_gate_breach_fails_its_wave_and_shows_each_devices_rollback() -> None:
    fleet = _fleet()
    rollout = Rollout.start(_spec(), fleet.devices, 0.0)
    now = 0.0
    while not rollout.done and now < 100:
        _advance(fleet, rollout, now)
        _telemetry(rollout, 90_000.0, int(now) * 10)
        now += 1
    doc = rollout_json(rollout.to_json())
    assert doc["state"] == "aborted"
    assert doc["reason"].startswith("gate breached: p95_ms 90 > 50")
    first, second, _ = doc["waves"]
    assert first["state"] == "aborted"
    assert first["gate"]["verdict"] == "fail"
    assert first["gate"]["figures"]["p95_ms"] == 90.0
    device = target_order("r1", NAMES)[0]
    assert first["devices"] == {device: "succeeded"}
    assert first["rollback"] == {device: "rolled_back"}
    assert second["state"] == "not_run"
    assert second["gate"]["verdict"] == "not_judged"


def test_a_failed_device_aborts_the_first_wave_and_says_why() -> None:
    fleet = _fleet()
    broken = target_order("r2", NAMES)[0]
    rollout = Rollout.start(_spec(id="r2", waves=(0.2, 1.0)), fleet.devices, 0.0)
    now = 0.0
    while not rollout.done and now < 100:
        _advance(fleet, rollout, now, broken=broken)
        now += 1
    first, second = rollout_json(rollout.to_json())["waves"]
    assert first["state"] == "aborted"
    assert first["devices"][broken] == "failed"
    assert set(first["rollback"].values()) == {"rolled_back"}
    assert first["details"][broken] == "load_failed: bad model"
    assert first["gate"]["verdict"] == "not_judged"
    assert second["state"] == "not_run"


def test_the_store_is_read_read_only_beside_its_writer(tmp_path: Path) -> None:
    db = tmp_path / "rollouts.sqlite"
    source = StoreRollouts(db)
    assert source.rollouts() == []
    assert not db.exists()  # a poll never creates the manager's file
    fleet = _fleet()
    store = RolloutStore(db)
    try:
        rollout = store.create(Rollout.start(_spec(), fleet.devices, 0.0), 0.0)
        _advance(fleet, rollout, 0.0)
        store.save(rollout, 0.0)
        [doc] = source.rollouts()
        assert doc["id"] == "r1"
        assert doc["waves"][0]["state"] == "running"
        # A writer in the middle of a transaction: the reader gets the last committed state,
        # at once, and the writer commits after it (bumping `updated`, as RolloutStore.save
        # does: the reader decodes a rollout again only when it changed).
        writer = sqlite3.connect(db, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE rollouts SET state = ?, updated = updated + 1",
                       [json.dumps({**rollout.to_json(), "phase": "paused"})])  # fmt: skip
        assert source.rollouts()[0]["state"] == "running"
        writer.execute("COMMIT")
        writer.close()
        assert source.rollouts()[0]["state"] == "paused"
        assert source.groups() == {}
    finally:
        store.close()
