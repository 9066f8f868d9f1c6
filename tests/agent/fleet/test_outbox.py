"""The outbox bound and drop order, the command-id store, config checks and GPU parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import AgentConfigError
from agent.fleet.config import MqttConfig, validate_mqtt
from agent.fleet.outbox import Outbox
from agent.fleet.state import FleetState


def test_drops_oldest_telemetry_first_then_events_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", max_messages=8)
    for i in range(3):
        box.put("event", "t/e", {"n": i})
    for i in range(10):
        box.put("telemetry", "t/t", {"n": i})
    stats = box.stats()
    assert (stats.queued, stats.dropped_telemetry, stats.dropped_events) == (8, 5, 0)
    for i in range(8):
        box.put("event", "t/e", {"n": 10 + i})
    stats = box.stats()
    assert (stats.dropped_telemetry, stats.dropped_events) == (10, 3)
    assert stats.last_seq == 21
    rows = box.take(100)
    assert len(rows) == box.max_take == 2
    assert [json.loads(r.payload)["seq"] for r in rows] == [r.seq for r in rows]
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    box.close()


def test_rows_in_flight_are_never_dropped_and_survive_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", max_messages=8)
    for i in range(8):
        box.put("telemetry", "t/t", {"n": i})
    flying = box.take(2)
    assert [r.seq for r in flying] == [1, 2]
    assert box.take(2) == []  # at most max_take rows in flight
    box.put("telemetry", "t/t", {"n": 8})  # full: 3, the oldest not in flight, goes
    box.ack([1])
    box.release()
    box.close()
    again = Outbox(tmp_path / "o.sqlite", max_messages=8)
    assert again.stats().dropped_telemetry == 1
    assert [r.seq for r in again.take(2)] == [2, 4]
    again.close()


def test_command_ids_and_desired_state(tmp_path: Path) -> None:
    state = FleetState(tmp_path / "s.sqlite", max_ids=3)
    assert state.begin("a", "ping")
    assert not state.begin("a", "ping")
    seen = state.seen("a")
    assert seen is not None
    assert seen.response is None
    state.finish("a", {"ok": True})
    seen = state.seen("a")
    assert seen is not None
    assert seen.response == {"ok": True}
    for name in "bcd":
        state.begin(name, "ping")
    assert state.seen("a") is None  # bounded: the oldest id is forgotten
    state.set_desired((("*", "latest"),))
    state.close()
    assert FleetState(tmp_path / "s.sqlite").desired() == (("*", "latest"),)


def test_config_validation(tmp_path: Path) -> None:
    validate_mqtt(MqttConfig())  # off
    validate_mqtt(MqttConfig(host="b", device_id="dev-1", slo=("m:p95_ms=5",)))
    for bad in (
        MqttConfig(host="b", device_id="a/b"),
        MqttConfig(host="b", device_id="d", topic_prefix="x/#"),
        MqttConfig(host="b", device_id="d", tls_cert=tmp_path / "c"),
        MqttConfig(host="b", device_id="d", tls_ca=tmp_path / "missing"),
        MqttConfig(host="b", device_id="d", slo=("m:p95=1",)),
        MqttConfig(host="b", device_id="d", outbox_max_messages=2),
    ):
        with pytest.raises(AgentConfigError, match="mqtt"):
            validate_mqtt(bad)
    assert MqttConfig().device()
