"""The pages' pure parts: the fleet view, the sampled history, the sparkline, the token check,
and the rendering (escaped, complete without JavaScript)."""

from __future__ import annotations

from agent.api.status_page import render_status
from agent.manager.dashboard_page import ago, render_dashboard
from agent.manager.dashboard_state import FleetView, split_topic
from agent.pages import sparkline, token_matches
from agent.runtime.status import History, RecentEvents


def _telemetry(requests: int, failures: int, p95: float | None) -> dict[str, object]:
    return {"kind": "telemetry", "ts": 100.0, "models": [
        {"model": "m", "version": 1, "requests": requests, "failures": failures,
         "latency_us": {"p95": p95}},
        {"model": "n", "version": 2, "requests": 0, "failures": 0, "latency_us": {"p95": 10.0}},
    ]}  # fmt: skip


def test_the_fleet_view_folds_status_telemetry_and_events() -> None:
    view = FleetView("edge", events_kept=2)
    status = {"state": "online", "ts": 50.0, "agent_version": "0.1.0",
              "models": [{"name": "m", "versions": [1, 2]}]}  # fmt: skip
    assert view.apply("edge/d1/status", status, now=60.0)
    assert view.apply("edge/d1/telemetry", _telemetry(100, 5, 2500.0), now=61.0)
    row = view.devices_json({"d1": ["lab"]})[0]
    assert row == {"device": "d1", "state": "online", "reason": "", "agent_version": "0.1.0",
                   "groups": ["lab"], "versions": {"m": [1, 2]}, "p95_us": 2500.0,
                   "error_rate": 0.05, "last_seen": 100.0}  # fmt: skip
    # The error rate is over the requests across the window of telemetry messages.
    view.apply("edge/d1/telemetry", _telemetry(200, 5, 900.0), now=62.0)
    assert view.devices_json({})[0]["error_rate"] == 0.0
    view.apply("edge/d1/telemetry", _telemetry(300, 15, 900.0), now=62.0)
    assert view.devices_json({})[0]["error_rate"] == 0.05  # 10 of 200
    # The agent restarted: its counters start again.
    view.apply("edge/d1/telemetry", _telemetry(10, 1, 900.0), now=63.0)
    assert view.devices_json({})[0]["error_rate"] == 0.1
    for n in range(3):
        view.apply("edge/d1/events", {"event": f"e{n}", "model": "m", "ts": 0.0}, now=64.0)
    assert [e["event"] for e in view.events()] == ["e2", "e1"]
    assert view.events()[0]["time"] == "1970-01-01 00:00:00"
    view.apply("edge/d1/status", {"state": "offline", "reason": "connection lost"}, now=99.0)
    assert view.devices_json({})[0]["state"] == "offline"
    assert view.devices_json({})[0]["last_seen"] == 0.0  # the will does not count as seen


def test_other_topics_are_ignored() -> None:
    view = FleetView("edge")
    assert not view.apply("edge/d1/responses", {"ok": True}, now=1.0)
    assert not view.apply("other/d1/status", {"state": "online"}, now=1.0)
    assert split_topic("edge", "edge/d1/status/extra") is None
    assert view.devices == {}


def test_history_keeps_the_last_samples_and_marks_gaps() -> None:
    history = History(size=2)
    model = {"model": "m", "version": 1, "inferences_per_s": 3.0,
             "latency_us": {"p50": 1.0, "p95": 2.0, "p99": 3.0}}  # fmt: skip
    history.add(1.0, [model])
    history.add(2.0, [model, {**model, "version": 2}])
    history.add(3.0, [{**model, "version": 2}])
    series = history.series()
    assert [s["ts"] for s in series["m:1"]] == [2.0, 3.0]
    assert [s["p95_us"] for s in series["m:1"]] == [2.0, None]
    assert [s["ips"] for s in series["m:2"]] == [3.0, 3.0]


def test_recent_events_newest_first_and_bounded() -> None:
    events = RecentEvents(size=2, clock=lambda: 0.0)
    for n in range(3):
        events.record("m", n, "version_loaded", {"object": object()})
    newest = events.newest()
    assert [e["version"] for e in newest] == [2, 1]
    assert newest[0]["detail"]["object"].startswith("<object")  # JSON-safe


def test_sparkline_scales_to_its_maximum_and_skips_gaps() -> None:
    svg = sparkline([0.0, None, 10.0], width=100, height=12)
    assert 'points="0.0,11.0 100.0,1.0"' in svg
    assert 'points=""' in sparkline([])


def test_the_token_check() -> None:
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cre", "s3cret")
    assert not token_matches(None, "s3cret")
    assert not token_matches("", "s3cret")


def test_rendering_escapes_what_devices_and_models_say() -> None:
    hostile = "<script>alert(1)</script>"
    page = render_status({"ready": True, "models": [
        {"name": hostile, "version": "1", "state": "UNAVAILABLE", "reason": hostile}]})  # fmt: skip
    assert page.count("<script>") == 2  # only our own two scripts
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    board = render_dashboard({"now": 10.0, "devices": [
        {"device": hostile, "state": "online", "last_seen": 4.0, "versions": {}}],
        "events": [], "rollouts": []})  # fmt: skip
    assert "&lt;script&gt;" in board
    assert board.count("<script>") == 2
    assert "No rollouts." in board
    assert "6 s ago" in board


def test_ages() -> None:
    assert ago(None, 5.0) == "\u2013"
    assert ago(0.0, 119.0) == "119 s ago"
    assert ago(0.0, 600.0) == "10 min ago"
    assert ago(0.0, 7200.0) == "2 h ago"


def test_a_gpu_reading_in_words() -> None:
    page = render_status({"ready": True, "models": [], "gpu": [
        {"index": 0, "uuid": "GPU-1", "util_percent": 35, "memory_used_bytes": 1 << 30,
         "memory_total_bytes": 8 << 30, "power_w": 41.25}]})  # fmt: skip
    assert '<th scope="row">GPU 0</th><td>35 % busy, 1.0 GiB of 8.0 GiB, 41.2 W</td>' in page


def test_the_memory_in_flight_in_words() -> None:
    memory = {
        "budget_bytes": 4 << 30,
        "used_bytes": 2 << 30,
        "inflight_capacity_bytes": 1 << 30,
        "inflight_bytes": 3 << 20,
        "inflight_peak_bytes": 171 << 20,
        "inflight_refused": 2,
    }
    page = render_status({"ready": True, "models": [], "memory": memory})
    assert (
        '<th scope="row">Memory in flight</th>'
        "<td>3.0 MiB of 1.0 GiB (peak 171.0 MiB, 2 refused)</td>"
    ) in page
    before = render_status({"ready": True, "models": [], "memory": {"budget_bytes": 1}})
    assert '<th scope="row">Memory in flight</th><td>\u2013</td>' in before


def test_a_waves_row_shows_job_states_rollbacks_details_and_the_gate() -> None:
    board = render_dashboard({"now": 10.0, "devices": [], "events": [], "rollouts": [
        {"id": "m-v3", "model": "m", "version": 3, "state": "aborted",
         "reason": "1 failed devices > 0 allowed", "waves": [
             {"name": "wave 1 (40%)", "state": "aborted",
              "devices": {"d1": "failed", "d2": "succeeded"},
              "rollback": {"d1": "rolled_back", "d2": "rolled_back"},
              "details": {"d1": "load_failed: <bad>"},
              "gate": {"verdict": "fail", "figures": {"p95_ms": 90.0},
                       "limits": {"p95_ms": 50.0}}}]}]})  # fmt: skip
    assert (
        '<span class="state-failed" title="load_failed: &lt;bad&gt;">d1: failed, '
        '<span class="state-rolled_back">rolled_back</span></span>'
    ) in board
    assert '<span class="state-succeeded">d2: succeeded, ' in board
    assert "<td>p95_ms 90.0 / 50.0</td>" in board
    assert '<td class="state-fail">fail</td>' in board
    assert "(1 failed devices &gt; 0 allowed)" in board
