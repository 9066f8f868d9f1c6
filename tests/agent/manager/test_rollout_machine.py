"""The rollout state machine, driven directly: no broker, no clock, simulated devices."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.inventory import device_facts, gpu_facts
from agent.manager.devices import DeviceView, Fleet
from agent.manager.rollout import Rollout
from agent.manager.rollout_gate import GateError, parse_gate
from agent.manager.rollout_plan import RolloutSpec, Send, wave_size
from agent.manager.rollout_store import RolloutConflictError, RolloutStore


def _fleet(n: int, *, group: str = "site-a", version: int = 1) -> Fleet:
    fleet = Fleet()
    for i in range(n):
        fleet.update(
            {"kind": "status", "device": f"d{i:02d}", "state": "online", "groups": [group],
             "models": [{"name": "m", "versions": [version]}]}
        )  # fmt: skip
    return fleet


def _apply(fleet: Fleet, rollout: Rollout, sends: list[Send], broken: set[str]) -> None:
    """What the devices do: activate switches (unless broken), and answer."""
    for send in sends:
        assert send.command == "activate"
        ok = send.device not in broken or send.args["version"] == 1
        if ok:
            fleet.update(
                {"kind": "status", "device": send.device, "state": "online", "groups": ["site-a"],
                 "models": [{"name": "m", "versions": [send.args["version"]]}]}
            )  # fmt: skip
        response: dict[str, Any] = {"ok": ok, "device": send.device}
        if not ok:
            response["error"] = {"code": "load_failed", "message": "bad model"}
        rollout.on_response(send.device, send.command_id, response)


def _spec(**kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {"id": "r1", "model": "m", "version": 2, "group": "site-a",
                            "soak_s": 10, "job_timeout_s": 30}  # fmt: skip
    return RolloutSpec(**{**base, **kw})


def _run(
    fleet: Fleet,
    rollout: Rollout,
    broken: frozenset[str] | set[str] = frozenset(),
    until: float = 500,
) -> None:
    now = rollout.started_at
    while not rollout.done and now < until:
        _apply(fleet, rollout, rollout.step(fleet.devices, now), set(broken))
        now += 1


def test_wave_sizes_are_cumulative_and_at_least_one() -> None:
    assert [wave_size(w, 20) for w in (0.05, 0.25, 1.0)] == [1, 5, 20]
    assert [wave_size(w, 3) for w in (0.05, 0.25, 1.0)] == [1, 1, 3]


def test_rollout_reaches_every_device_in_three_waves() -> None:
    fleet = _fleet(20)
    rollout = Rollout.start(_spec(), fleet.devices, 0.0)
    _run(fleet, rollout)
    assert rollout.phase == "succeeded"
    assert {j.state for j in rollout.jobs.values()} == {"succeeded"}
    assert all(d.versions("m") == (2,) for d in fleet.devices.values())
    waves = [e for e in rollout.take_events() if e["event"] == "wave_deployed"]
    assert [w["devices"] for w in waves] == [1, 5, 20]
    assert [w["jobs"] for w in waves] == [{"succeeded": 1}, {"succeeded": 5}, {"succeeded": 20}]


def test_targets_are_deterministic_and_differ_by_rollout() -> None:
    fleet = _fleet(20)
    first = Rollout.start(_spec(), fleet.devices, 0.0).targets
    assert Rollout.start(_spec(), fleet.devices, 5.0).targets == first
    assert Rollout.start(_spec(id="r2"), fleet.devices, 0.0).targets != first


def test_failures_abort_and_roll_back_every_touched_device() -> None:
    fleet = _fleet(20)
    rollout = Rollout.start(_spec(waves=(0.25, 1.0)), fleet.devices, 0.0)
    first_wave = rollout.targets[:5]
    broken = set(first_wave[:2])
    _run(fleet, rollout, broken)
    assert rollout.phase == "aborted"
    assert "2 failed devices > 0 allowed" in rollout.reason
    assert {rollout.jobs[d].state for d in broken} == {"failed"}
    assert set(rollout.jobs) == set(first_wave)  # never went past the first wave
    assert {j.rollback for j in rollout.jobs.values()} == {"succeeded"}
    assert all(d.versions("m") == (1,) for d in fleet.devices.values())
    events = {e["event"]: e for e in rollout.take_events()}
    assert "bad model" in json.dumps(events["aborted"]["failed"])
    assert events["rolled_back"]["succeeded"] == len(first_wave) - 0


def test_max_failed_devices_tolerates_that_many() -> None:
    fleet = _fleet(20)
    rollout = Rollout.start(_spec(max_failed=1), fleet.devices, 0.0)
    _run(fleet, rollout, {rollout.targets[3]})
    assert rollout.phase == "succeeded"
    assert sum(j.state == "failed" for j in rollout.jobs.values()) == 1


def test_gate_breach_against_baseline_rolls_back() -> None:
    fleet = _fleet(10)
    rollout = Rollout.start(
        _spec(gate="p95_ms<=50,error_rate<=0.01", waves=(0.2, 1.0)), fleet.devices, 0.0
    )
    now = 0.0
    _apply(fleet, rollout, rollout.step(fleet.devices, now), set())
    now += 1
    rollout.step(fleet.devices, now)
    assert rollout.phase == "soaking"
    for count in (100, 200):  # two readings across the soak per device
        for device, view in fleet.devices.items():
            version = view.versions("m")[0]
            bad = version == 2
            entry = {"model": "m", "version": version, "requests": count,
                     "failures": count // 10 if bad else 0,
                     "latency_us": {"p95": 80_000 if bad else 5_000, "p99": None}}  # fmt: skip
            rollout.on_telemetry(device, {"models": [entry]})
    now += 10
    sends = rollout.step(fleet.devices, now)
    events = {e["event"]: e for e in rollout.take_events()}
    breach = events["gate_breached"]
    assert sorted(b.split()[0] for b in breach["breaches"]) == ["error_rate", "p95_ms"]
    assert breach["candidate"]["requests"] == 2 * 100
    assert breach["candidate"]["failures"] == 2 * 10
    assert breach["baseline"]["devices"] == 8
    assert breach["baseline"]["error_rate"] == 0
    assert rollout.phase == "rolling_back"
    assert [(s.command, s.args["version"]) for s in sends] == [("activate", 1)] * 2


def test_state_round_trips_and_resends_in_flight_commands_with_the_same_ids() -> None:
    fleet = _fleet(20)
    rollout = Rollout.start(_spec(), fleet.devices, 0.0)
    sends = rollout.step(fleet.devices, 0.0)
    assert len(sends) == 1
    stored = json.loads(json.dumps(rollout.to_json()))
    again = Rollout.from_json(stored)
    resent = again.resend()
    assert resent == sends  # same device, same command id: the device deduplicates
    _apply(fleet, again, resent, set())
    _run(fleet, again)
    assert again.phase == "succeeded"


def test_offline_device_is_not_reached_and_does_not_hold_the_wave() -> None:
    fleet = _fleet(4)
    rollout = Rollout.start(_spec(waves=(1.0,), soak_s=0, job_timeout_s=5), fleet.devices, 0.0)
    away = rollout.targets[0]
    fleet.update({"kind": "status", "device": away, "state": "offline", "reason": "lost"})
    assert fleet.devices[away].groups == ("site-a",)  # the will keeps what was known
    _run(fleet, rollout)
    assert rollout.phase == "succeeded"
    assert rollout.jobs[away].state == "queued"
    done = next(e for e in rollout.take_events() if e["event"] == "rollout_succeeded")
    assert done["not_reached"] == [away]


def test_pause_resume_abort_are_idempotent() -> None:
    fleet = _fleet(5)
    rollout = Rollout.start(_spec(), fleet.devices, 0.0)
    _apply(fleet, rollout, rollout.step(fleet.devices, 0.0), set())
    rollout.pause(1.0)
    rollout.pause(2.0)
    assert rollout.step(fleet.devices, 100.0) == []
    rollout.resume(3.0)
    rollout.resume(4.0)
    rollout.abort(5.0, "operator")
    rollout.abort(6.0, "operator")
    kinds = [e["event"] for e in rollout.take_events()]
    assert kinds.count("paused") == kinds.count("resumed") == kinds.count("aborted") == 1
    _run(fleet, rollout)
    assert rollout.phase == "aborted"
    assert all(d.versions("m") == (1,) for d in fleet.devices.values())


@pytest.mark.parametrize("gate", ["p95_ms>50", "latency<=3", "p95_ms<=-1", "p95_ms<=fast"])
def test_bad_gate_is_refused(gate: str) -> None:
    with pytest.raises(GateError):
        parse_gate(gate)


def test_bad_specs_are_refused() -> None:
    for kw in ({"waves": (0.5,)}, {"waves": (0.5, 0.25, 1.0)}, {"id": "a.b"}, {"via": "x"}):
        with pytest.raises(ValueError, match=r"waves|rollout id|via"):
            _spec(**kw)
    with pytest.raises(ValueError, match="no device is in group"):
        Rollout.start(_spec(group="nowhere"), _fleet(2).devices, 0.0)


def test_device_view_reads_inventory() -> None:
    view = DeviceView.from_status(
        {"kind": "status", "device": "x", "state": "degraded", "groups": ["a"],
         "models": [{"name": "m", "versions": [1, True, "2"]}], "inventory": {"python": "3"}}
    )  # fmt: skip
    assert view is not None
    assert view.online
    assert view.versions("m") == (1,)
    assert DeviceView.from_status({"kind": "telemetry", "device": "x"}) is None


def test_device_facts_from_proc_and_tegra_files(tmp_path: Path) -> None:
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       16012345 kB\nMemFree: 1 kB\n")
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nModel\t\t: NVIDIA Orin NX\n")
    (tmp_path / "proc/device-tree/model").write_text("NVIDIA Jetson Orin NX\0")
    (tmp_path / "etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64\n"
    )
    facts = device_facts(tmp_path)
    assert facts["memory_bytes"] == 16012345 * 1024
    assert facts["cpu_model"] == "NVIDIA Orin NX"
    assert facts["board"] == "NVIDIA Jetson Orin NX"
    assert facts["l4t"] == "36.3.0"
    assert "numpy" in facts["packages"]
    bare = device_facts(tmp_path / "nothing")
    assert not {"memory_bytes", "cpu_model", "board", "l4t"} & set(bare)
    assert gpu_facts([{"index": 0, "util_percent": 5, "memory_total_bytes": 8}]) == [
        {"index": 0, "memory_total_bytes": 8}
    ]


def test_store_is_idempotent_refuses_conflicts_and_queues_requests(tmp_path: Path) -> None:
    fleet = _fleet(5)
    store = RolloutStore(tmp_path / "rollouts.sqlite")
    try:
        first = store.create(Rollout.start(_spec(), fleet.devices, 0.0), 0.0)
        first.step(fleet.devices, 1.0)
        store.save(first, 1.0)
        again = store.create(Rollout.start(_spec(), fleet.devices, 9.0), 9.0)
        assert again.to_json() == first.to_json()  # the same id and spec: the stored one
        with pytest.raises(RolloutConflictError, match="another spec"):
            store.create(Rollout.start(_spec(soak_s=1), fleet.devices, 9.0), 9.0)
        with pytest.raises(RolloutConflictError, match="has not finished"):
            store.create(Rollout.start(_spec(id="r2"), fleet.devices, 9.0), 9.0)
        kinds = [e["event"] for _n, e in store.events("r1")]
        assert kinds[:2] == ["rollout_started", "wave_started"]
        store.request("r1", "pause", 2.0)
        store.request("r1", "abort", 3.0)
        assert store.take_requests("r1") == [("pause", 2.0), ("abort", 3.0)]
        assert store.take_requests("r1") == []
        assert store.driver("r1", 3.0) is None
        store.heartbeat("r1", os.getpid(), 3.0)
        assert store.driver("r1", 4.0) == os.getpid()
        assert store.driver("r1", 30.0) is None  # stale
        assert store.latest() == "r1"
    finally:
        store.close()


def test_offline_device_holds_only_its_own_wave() -> None:
    fleet = _fleet(10)
    rollout = Rollout.start(_spec(waves=(0.1, 1.0), soak_s=0, job_timeout_s=5), fleet.devices, 0.0)
    away = rollout.targets[0]
    fleet.update({"kind": "status", "device": away, "state": "offline"})
    _run(fleet, rollout, until=9)  # wave 1 waits 5 s for it; wave 2 does not wait again (11)
    assert rollout.phase == "succeeded"
    deployed = [e for e in rollout.take_events() if e["event"] == "wave_deployed"]
    assert [w["not_reached"] for w in deployed] == [[away], [away]]
