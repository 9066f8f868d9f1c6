"""The dashboard at fleet scale: devices a page at a time with the fleet's counts, large waves
summed up, bad page parameters answered 400 (over a real socket), and the rollouts file decoded
again only when it changed."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from agent.manager.dashboard import Dashboard
from agent.manager.dashboard_page import pager_text, render_dashboard, summary, wave_devices
from agent.manager.dashboard_state import MAX_PER_PAGE, DeviceQuery, FleetView
from agent.manager.devices import DeviceView
from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import RolloutSpec
from agent.manager.rollout_store import RolloutStore
from agent.manager.rollout_view import WAVE_LIST, StoreRollouts, rollout_json
from agent.wire.mqtt import MqttSettings
from tests.support import free_port, http_get

N = 1234


def _fleet(n: int = N) -> FleetView:
    view = FleetView("edge")
    for i in range(n):
        state = "offline" if i % 100 == 7 else "degraded" if i % 250 == 3 else "online"
        doc = {
            "kind": "status",
            "device": f"dev{i:04d}",
            "state": state,
            "groups": ["g"],
            "models": [{"name": "m", "versions": [1]}],
        }
        view.apply(f"edge/dev{i:04d}/status", doc, 100.0)
    return view


def test_a_page_holds_per_page_devices_sorted_and_the_fleets_counts() -> None:
    view = _fleet()
    first = view.page({}, DeviceQuery())
    assert [r["device"] for r in first.rows] == [f"dev{i:04d}" for i in range(50)]
    assert (first.page, first.pages, first.matching, first.total) == (1, 25, N, N)
    assert first.counts == {"online": N - 13 - 5, "degraded": 5, "offline": 13, "unknown": 0}
    last = view.page({}, DeviceQuery(page=25))
    assert len(last.rows) == N - 24 * 50
    beyond = view.page({}, DeviceQuery(page=99))  # a page past the end shows the last one
    assert beyond.page == 25
    assert beyond.rows == last.rows


def test_filters_by_state_and_by_a_part_of_the_id() -> None:
    view = _fleet()
    offline = view.page({}, DeviceQuery(state="offline", per_page=500))
    assert offline.matching == 13
    assert {r["state"] for r in offline.rows} == {"offline"}
    found = view.page({}, DeviceQuery(search="DEV012"))  # case does not matter
    assert [r["device"] for r in found.rows] == [f"dev012{i}" for i in range(10)]
    assert found.counts == view.page({}, DeviceQuery()).counts  # counts are the fleet's
    assert view.page({}, DeviceQuery(search="nobody")).rows == []


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"page": "0"}, "page must be an integer >= 1"),
        ({"page": "two"}, "page must be an integer"),
        ({"per_page": str(MAX_PER_PAGE + 1)}, f"per_page must be an integer in 1..{MAX_PER_PAGE}"),
        ({"state": "asleep"}, "state must be one of online, degraded, offline, unknown"),
        ({"q": "x" * 129}, "q must be at most 128 characters"),
    ],
)
def test_bad_page_parameters_say_what_to_fix(params: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        DeviceQuery.parse(params)


def test_the_page_renders_one_page_and_says_where_it_is() -> None:
    view = _fleet()
    found = view.page({}, DeviceQuery(page=3))
    state = {"now": 100.0, "devices": found.rows, **found.to_json(), "rollouts": [], "events": []}
    html = render_dashboard(state)
    assert html.count('href="fleet/v1/devices/dev') == 50
    assert summary(state) == f"{N - 13:,} of {N:,} devices online"
    assert pager_text(state) == f"Page 3 of 25 ({N:,} devices)"
    assert 'id="page-prev"' in html
    assert 'id="page-next"' in html
    assert f"offline ({13:,})" in html


def _big_rollout(n: int) -> Rollout:
    devices = {
        f"d{i:04d}": DeviceView(f"d{i:04d}", "online", ("g",), {"m": (1,)}) for i in range(n)
    }
    rollout = Rollout.start(RolloutSpec("big", "m", 2, "g", waves=(1.0,), soak_s=0.0), devices, 0.0)
    rollout.step(devices, 0.0)
    for i, job in enumerate(rollout.jobs.values()):
        job.state = "failed" if i < 3 else "succeeded"
        job.detail = "load_failed: broken" if i < 3 else ""
    return rollout


def test_a_large_wave_shows_counts_and_only_the_devices_worth_a_look() -> None:
    rollout = _big_rollout(400)
    [wave] = rollout_json(rollout.to_json())["waves"]
    assert wave["size"] == 400
    assert wave["counts"] == {"failed": 3, "succeeded": 397}
    assert set(wave["devices"].values()) == {"failed"}
    assert len(wave["devices"]) == 3
    assert wave["more"] == 397
    assert all(d in wave["details"] for d in wave["devices"])
    text = wave_devices(wave)
    assert "failed 3" in text
    assert "succeeded 397" in text
    assert "397 more of 400" in text
    small = rollout_json(_big_rollout(WAVE_LIST).to_json())["waves"][0]
    assert (len(small["devices"]), small["more"]) == (WAVE_LIST, 0)  # small waves list all


def test_the_rollouts_file_is_decoded_again_only_when_it_changed(tmp_path: Path) -> None:
    db = tmp_path / "rollouts.sqlite"
    store = RolloutStore(db)
    source = StoreRollouts(db)
    try:
        rollout = _big_rollout(60)
        store.create(rollout, 1.0)
        first = source.rollouts()
        assert source.rollouts()[0] is first[0]  # unchanged: the same decoded object
        rollout.phase = "aborted"
        store.save(rollout, 2.0)
        assert source.rollouts()[0]["state"] == "aborted"
    finally:
        store.close()


def test_the_routes_answer_a_page_and_refuse_a_bad_one() -> None:
    # No broker: the dashboard serves what it folded (here nothing) and says it is not connected.
    board = Dashboard(MqttSettings("127.0.0.1", free_port(), "board"))
    for i in range(120):
        board.view.apply(
            f"edge/dev{i:03d}/status",
            {"kind": "status", "device": f"dev{i:03d}", "state": "online"},
            1.0,
        )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = asyncio.run_coroutine_threadsafe(board.start("127.0.0.1", 0), loop).result(30)
    base = f"http://127.0.0.1:{port}"
    try:
        status, body = http_get(f"{base}/fleet/v1/state?page=3&per_page=50")
        doc = json.loads(body)
        assert status == 200
        assert [d["device"] for d in doc["devices"]] == [f"dev{i:03d}" for i in range(100, 120)]
        assert (doc["page"], doc["pages"], doc["devices_total"]) == (3, 3, 120)
        status, body = http_get(f"{base}/fleet/v1/state?per_page=5000")
        assert status == 400
        assert json.loads(body) == {"error": f"per_page must be an integer in 1..{MAX_PER_PAGE}"}
        status, body = http_get(f"{base}/?state=asleep")
        assert status == 400
        assert b"state must be one of" in body
        status, body = http_get(f"{base}/?q=dev11")
        assert status == 200
        assert body.count(b'href="fleet/v1/devices/dev') == 10
    finally:
        asyncio.run_coroutine_threadsafe(board.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
