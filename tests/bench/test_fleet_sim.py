"""The simulated device speaks the agent's protocol: its commands, answers, status and telemetry
are built by the agent's own code and read by the manager's."""

from __future__ import annotations

import json
from typing import Any

from agent.fleet.documents import SCHEMA
from agent.manager.devices import DeviceView
from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import RolloutSpec
from agent.wire.topics import Topics
from bench.sim_device import MAX_IDS, Profile, SimDevice, share_of


def _device(name: str = "d1", **profile: Any) -> SimDevice:
    return SimDevice(name, ("fleet", "site-0"), Profile(**profile), Topics("edge", name), 0.0,
                     serving=1)  # fmt: skip


def _command(command: str, cid: str = "c1", **args: Any) -> bytes:
    doc: dict[str, Any] = {"schema": 1, "id": cid, "command": command}
    if args:
        doc["args"] = args
    return json.dumps(doc).encode()


def test_activate_swaps_and_is_answered_once_per_id() -> None:
    device = _device()
    answer = device.answer(_command("activate", model="m", version=2), 5.0)
    assert (answer["ok"], answer["result"]) == (
        True,
        {"model": "m", "strategy": "load-then-switch"},
    )
    assert {answer[k] for k in ("kind", "device", "id", "command")} == {
        "response", "d1", "c1", "activate"}  # fmt: skip
    assert answer["schema"] == SCHEMA
    assert device.serving == 2
    again = device.answer(_command("activate", model="m", version=3), 6.0)  # the same id
    assert again["duplicate"] is True
    assert again["result"] == answer["result"]
    assert device.serving == 2  # not executed twice
    assert [(e.command, e.version, e.ok) for e in device.log] == [("activate", 2, True)]
    assert device.duplicates == 1


def test_a_broken_version_fails_to_load_and_the_old_one_serves_on() -> None:
    device = _device(broken=frozenset({"d1"}), broken_version=3)
    answer = device.answer(_command("activate", model="m", version=3), 5.0)
    assert answer["ok"] is False
    assert answer["error"]["code"] == "load_failed"
    assert device.serving == 1
    assert device.status(5.0)["rejected"][0]["version"] == 3
    other = _device("d2", broken=frozenset({"d1"}), broken_version=3)
    assert other.answer(_command("activate", model="m", version=3), 5.0)["ok"] is True


def test_rollback_goes_to_the_previous_version_and_rejects_the_one_left() -> None:
    device = _device()
    device.answer(_command("activate", "a", model="m", version=2), 1.0)
    device.answer(_command("activate", "b", model="m", version=3), 2.0)
    answer = device.answer(_command("rollback", "c", model="m"), 3.0)
    assert answer["result"] == {"model": "m", "version": 2}
    assert device.serving == 2
    assert [r["version"] for r in device.status(3.0)["rejected"]] == [3]
    nothing = _device().answer(_command("rollback", model="m"), 1.0)
    assert nothing["error"]["code"] == "not_found"


def test_set_desired_then_sync_activates_the_desired_version() -> None:
    device = _device()
    stored = device.answer(_command("set-desired", "a", models={"m": "3"}), 1.0)
    assert stored["result"]["desired"] == {"m": "3"}
    assert device.serving == 1
    synced = device.answer(_command("sync", "b"), 2.0)
    assert synced["result"]["activated"] == [["m", 3]]
    assert device.serving == 3
    assert device.status(2.0)["desired"] == {"m": "3"}


def test_bad_commands_get_the_agents_error_codes() -> None:
    device = _device()
    assert device.answer(b"not json", 1.0)["error"]["code"] == "bad_command"
    unknown = device.answer(_command("activate", model="nope", version=2), 1.0)
    assert unknown["error"]["code"] == "not_found"
    missing = device.answer(_command("activate", "c2", model="m", version=9), 1.0)
    assert missing["error"]["code"] == "not_found"
    assert device.answer(_command("unload", "c3", model="m"), 1.0)["error"]["code"] == "not_allowed"
    assert device.answer(b"x" * 70_000, 1.0)["error"]["code"] == "too_large"


def test_only_the_newest_ids_are_remembered() -> None:
    device = _device()
    for i in range(MAX_IDS + 5):
        device.answer(_command("ping", f"p{i}"), 1.0)
    assert len(device.seen) == MAX_IDS
    assert "p0" not in device.seen
    assert device.log == []  # read-only commands are not logged as executed


def test_the_manager_reads_the_simulated_status_and_telemetry() -> None:
    device = _device(regress=frozenset({"d1"}), regress_version=2)
    view = DeviceView.from_status(device.status(1.0))
    assert view is not None
    assert (view.device, view.state, view.groups, view.versions("m")) == (
        "d1", "online", ("fleet", "site-0"), (1,))  # fmt: skip
    doc, samples = device.telemetry(10.0, 10.0)
    assert (doc["kind"], doc["seq"]) == ("telemetry", 1)
    entry = doc["models"][0]
    assert (entry["model"], entry["version"]) == ("m", 1)
    assert entry["requests"] > 0
    assert entry["latency_us"]["p95"] < 50_000
    assert samples[0].version == 1
    # The rollout state machine sends, the device answers, the manager confirms and soaks.
    spec = RolloutSpec("r", "m", 2, "fleet", waves=(1.0,), soak_s=60.0)
    rollout = Rollout.start(spec, {"d1": view}, 11.0)
    [send] = rollout.step({"d1": view}, 11.0)
    command = {"schema": 1, "id": send.command_id, "command": send.command,
               "args": dict(send.args)}  # fmt: skip
    rollout.on_response("d1", send.command_id, device.answer(json.dumps(command).encode(), 12.0))
    served = DeviceView.from_status(device.status(12.0))
    assert served is not None
    rollout.step({"d1": served}, 12.0)
    assert (rollout.phase, rollout.jobs["d1"].state) == ("soaking", "succeeded")
    regressed, _ = device.telemetry(20.0, 10.0)
    assert regressed["models"][0]["latency_us"]["p95"] > 200_000
    rollout.on_telemetry("d1", regressed)
    window = rollout.windows["d1"]["new"]
    assert window.p95_ms is not None
    assert window.p95_ms > 200


def test_shares_are_fixed_by_their_salt() -> None:
    names = [f"d{i}" for i in range(200)]
    picked = share_of(names, 0.05, "s")
    assert len(picked) == 10
    assert picked == share_of(list(reversed(names)), 0.05, "s")
    assert picked != share_of(names, 0.05, "t")
