"""The fleet dashboard (`edge-agent fleet dashboard`) with real fleet links on a Mosquitto broker,
in a real browser: three devices, a rollout moving wave by wave (through the `RolloutSource`
interface), a device's telemetry opened from the keyboard, and the token."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.dashboard import Dashboard
from agent.pages import UNAUTHORIZED
from tests.mqtt.support import AgentThread, Broker, LinkFactory, mqtt_config
from tests.pages.browser import (
    browser_fixture,
    first_paint_ms,
    rows_of,
    screenshots,
    text_of,
    wait_for,
)

browser = browser_fixture()
DEVICES = ("dev1", "dev2", "dev3")


class Rollouts:
    """A rollout store as the test moves it (the `RolloutSource` interface)."""

    def __init__(self) -> None:
        self.waves: list[dict[str, Any]] = [
            {"name": "canary", "state": "running", "devices": {"dev1": "pending"},
             "gate": {"verdict": "waiting", "figures": {}, "limits": {"p95_ms": 50}}},
            {"name": "wave 2", "state": "pending",
             "devices": {"dev2": "pending", "dev3": "pending"}, "gate": None},
        ]  # fmt: skip
        self.state = "running"
        self.reason = ""

    def rollouts(self) -> list[dict[str, Any]]:
        return [{"id": "r1", "model": "m", "version": 2, "state": self.state,
                 "reason": self.reason, "waves": self.waves}]  # fmt: skip

    def groups(self) -> dict[str, list[str]]:
        return {"dev1": ["canary", "lab"], "dev2": ["lab"], "dev3": ["field"]}


@pytest.fixture
def devices(start_link: LinkFactory, broker: Broker, tmp_path: Path) -> tuple[str, ...]:
    for device in DEVICES:
        start_link(mqtt_config(broker, device_id=device), tmp_path / f"{device}.sqlite")
    return DEVICES


@pytest.fixture
def board(served: AgentThread, broker: Broker) -> Iterator[tuple[Dashboard, Rollouts, str]]:
    rollouts = Rollouts()
    dashboard = Dashboard(broker.settings(), rollouts=rollouts)
    port = served.run(dashboard.start("127.0.0.1", 0))
    try:
        yield dashboard, rollouts, f"http://127.0.0.1:{port}/"
    finally:
        served.run(dashboard.stop())


def _rows(driver: Any, css: str) -> list[str]:
    return rows_of(driver, css)


def _online(driver: Any) -> bool:
    rows = _rows(driver, "#devices-body tr")
    return len(rows) == 3 and all(" online " in f" {r} " for r in rows)


def test_the_dashboard_shows_three_devices_a_rollout_moving_and_a_devices_telemetry(
    browser: Any,
    served: AgentThread,
    devices: tuple[str, ...],
    board: tuple[Dashboard, Rollouts, str],
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _, rollouts, url = board
    browser.get(url)
    print(f"fleet dashboard: first contentful paint {first_paint_ms(browser):.1f} ms")
    wait_for(browser, _online)
    rows = _rows(browser, "#devices-body tr")
    assert rows[0].startswith("dev1 online canary, lab m: 1 "), rows
    assert "No rollouts" not in text_of(browser, "#rollouts")
    browser.execute_script("window.notReloaded = true;")

    # The canary wave passes its gate; wave 2 starts.
    rollouts.waves[0].update(state="done", devices={"dev1": "activated"},
                             gate={"verdict": "pass", "figures": {"p95_ms": 4.2},
                                   "limits": {"p95_ms": 50}})  # fmt: skip
    rollouts.waves[1].update(state="running", devices={"dev2": "activated", "dev3": "pending"})
    wait_for(browser, lambda d: "canary done dev1: activated p95_ms 4.2 / 50 pass"
             in _rows(d, "#waves-r1 tr"))  # fmt: skip
    # Wave 2 fails its gate: the rollout is aborted.
    rollouts.waves[1].update(state="aborted", devices={"dev2": "failed", "dev3": "pending"},
                             gate={"verdict": "fail", "figures": {"error_rate": 0.2},
                                   "limits": {"error_rate": 0.01}})  # fmt: skip
    rollouts.state, rollouts.reason = "aborted", "wave 2 failed its gate"
    wait_for(browser, lambda d: "aborted (wave 2 failed its gate)" in text_of(d, "#rollouts"))
    assert "wave 2 aborted dev2: failed dev3: pending error_rate 0.2 / 0.01 fail" in _rows(
        browser, "#waves-r1 tr"
    )

    # An event from the agent reaches the feed of every device.
    served.events.record("m", 2, "version_activated", {"strategy": "swap"})
    wait_for(browser, lambda d: len([r for r in _rows(d, "#events-body tr")
                                     if "version_activated" in r]) == 3)  # fmt: skip
    assert browser.execute_script("return window.notReloaded === true;")
    screenshots(browser, "dashboard")

    # A device's row opens its last telemetry, from the keyboard.
    link = browser.find_element(By.CSS_SELECTOR, 'a.device[data-device="dev2"]')
    link.send_keys(Keys.ENTER)
    wait_for(browser, lambda d: '"device": "dev2"' in text_of(d, "#telemetry-json"))
    assert '"kind": "telemetry"' in text_of(browser, "#telemetry-json")
    assert browser.switch_to.active_element.get_attribute("id") == "telemetry-json"


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), bytes(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_with_a_token_every_route_answers_401_without_it(
    served: AgentThread, broker: Broker
) -> None:
    dashboard = Dashboard(broker.settings(), token="s3cret")
    port = served.run(dashboard.start("127.0.0.1", 0))
    base = f"http://127.0.0.1:{port}"
    try:
        for path in ("/", "/fleet/v1/state", "/fleet/v1/devices/dev1/telemetry"):
            for headers in ({}, {"Authorization": "Bearer s3cre"}):
                assert _get(base + path, headers) == (401, UNAUTHORIZED)
            assert _get(base + path + "?token=nope") == (401, UNAUTHORIZED)
        status, body = _get(base + "/fleet/v1/state", {"Authorization": "Bearer s3cret"})
        assert status == 200
        assert b'"access":"token"' in body
        assert _get(base + "/?token=s3cret")[0] == 200
        # A device never heard from: 404 with a JSON error, once the token is right.
        status, body = _get(base + "/fleet/v1/devices/nobody/telemetry?token=s3cret")
        assert status == 404
        assert b"nobody" in body
    finally:
        served.run(dashboard.stop())
