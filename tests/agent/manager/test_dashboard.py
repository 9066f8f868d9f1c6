"""The fleet dashboard (`edge-agent fleet dashboard`) with real agents on a Mosquitto broker,
in a real browser: five agents under traffic, a real rollout (the `fleet rollout` driver in its
own process, its SQLite file read by `StoreRollouts`) advancing wave by wave on the page
without a reload, a bad version aborted in its first wave and rolled back, a device's telemetry
opened from the keyboard, and the token."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from agent.manager.dashboard import Dashboard
from agent.manager.rollout_plan import target_order
from agent.manager.rollout_view import StoreRollouts
from agent.pages import UNAUTHORIZED
from tests.agent.pages.browser import (
    browser_fixture,
    first_paint_ms,
    rows_of,
    screenshots,
    text_of,
    wait_for,
)
from tests.fleet_support import Device, fleet_process, run_fleet
from tests.mqtt_support import Broker
from tests.support import free_port, http_get

browser = browser_fixture()
NAMES = [f"dev{i}" for i in range(5)]
GROUPS = {n: ("lab", "site-a" if i % 2 else "site-b") for i, n in enumerate(NAMES)}
BAD_ROLLOUT = "m-v3"
# Version 3 does not load on the first device its rollout reaches.
BROKEN = target_order(BAD_ROLLOUT, NAMES)[0]
# Each redraw of the first rollout's waves: their states, as the page showed them.
RECORD = """
window.seen = [];
const record = () => {
  const rows = [...document.querySelectorAll("#waves-m-v2 tr")];
  const states = rows.map((tr) => tr.children[1].textContent).join(",");
  if (states && states !== window.seen[window.seen.length - 1]) window.seen.push(states);
};
new MutationObserver(record).observe(document.getElementById("rollouts"),
                                     {childList: true, subtree: true});
window.notReloaded = true;
"""


class Traffic:
    """Requests to every device, round robin, until stopped: the gate's figures are real."""

    def __init__(self, devices: list[Device]) -> None:
        self.clients = [
            httpclient.InferenceServerClient(f"127.0.0.1:{d.running.agent.http_port}")
            for d in devices
        ]
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), dtype=np.float32))
        while not self._stop.is_set():
            for client in self.clients:
                client.infer("m", [tensor])
                self.sent += 1
            self._stop.wait(0.02)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for client in self.clients:
            client.close()


@pytest.fixture
def fleet(broker: Broker, tmp_path: Path) -> Iterator[dict[str, Device]]:
    with run_fleet(broker, tmp_path / "fleet", GROUPS, {BROKEN}) as devices:
        yield devices


@pytest.fixture
def board(fleet: dict[str, Device], broker: Broker, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The dashboard over the rollouts file the driver will create: (that file, the page)."""
    db = tmp_path / "rollouts.sqlite"
    dashboard = Dashboard(broker.settings(), rollouts=StoreRollouts(db))
    running = fleet[NAMES[0]].running
    port = running.run(dashboard.start("127.0.0.1", 0))
    try:
        yield db, f"http://127.0.0.1:{port}/"
    finally:
        running.run(dashboard.stop())


def _online(driver: Any) -> bool:
    rows = rows_of(driver, "#devices-body tr")
    return len(rows) == len(NAMES) and all(" online " in f" {r} " for r in rows)


def _rollout(broker: Broker, db: Path, log: Path, *args: str) -> int:
    """Run `fleet rollout start ...` (the real driver, its own process) to its end."""
    manager = fleet_process(broker, "rollout", "start", *args, "--db", str(db), "--tick", "0.05",
                            log=log)  # fmt: skip
    try:
        return manager.wait(60)
    finally:
        if manager.poll() is None:
            manager.kill()


def _in_order(seen: list[str], wanted: list[str]) -> bool:
    """Whether `wanted` appear in `seen` in this order (others may come between)."""
    rest = iter(seen)
    return all(any(s == w for s in rest) for w in wanted)


def test_the_dashboard_follows_a_real_rollout_wave_by_wave_and_a_bad_versions_rollback(
    browser: Any, broker: Broker, fleet: dict[str, Device], board: tuple[Path, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    db, url = board
    browser.get(url)
    print(f"fleet dashboard: first contentful paint {first_paint_ms(browser):.1f} ms")
    wait_for(browser, _online)
    assert "No rollouts" in text_of(browser, "#rollouts")
    assert rows_of(browser, "#devices-body tr")[0].startswith("dev0 online lab, site-b m: 1 ")
    browser.execute_script(RECORD)
    log = tmp_path / "manager.log"
    with Traffic(list(fleet.values())) as traffic:
        code = _rollout(broker, db, log, "m", "2", "--group", "lab", "--waves", "20%,60%,100%",
                        "--gate", "error_rate<=0.01,p95_ms<=1000", "--soak", "3s")  # fmt: skip
        assert code == 0, log.read_text()
        wait_for(browser, lambda d: "m-v2: m v2 succeeded" in text_of(d, "#rollouts"))
        seen = browser.execute_script("return window.seen;")
        # Each wave soaked (3 s > the page's 2 s poll) while the next still waited.
        assert _in_order(seen, ["soaking,pending,pending", "done,soaking,pending",
                                "done,done,soaking", "done,done,done"]), seen  # fmt: skip
        waves = rows_of(browser, "#waves-m-v2 tr")
        assert len(waves) == 3
        gate = re.compile(r"error_rate 0(\.0+)? / 0\.01; p95_ms \d+(\.\d+)? / 1000 pass$")
        assert all(gate.search(w) for w in waves), waves
        assert waves[0].startswith("wave 1 (20%) done ")
        assert sum(w.count(": succeeded") for w in waves) == len(NAMES)
        # The rows' figures come from the devices' telemetry under the same traffic.
        p95 = re.compile(r"^dev0 online lab, site-b m: 2 \d+\.\d\d 0\.00 % ")
        wait_for(browser, lambda d: p95.match(rows_of(d, "#devices-body tr")[0]))

        code = _rollout(broker, db, log, "m", "3", "--group", "lab", "--waves", "40%,100%",
                        "--soak", "1s")  # fmt: skip
        assert code == 1, log.read_text()
        print(f"traffic during both rollouts: {traffic.sent} requests")
    aborted = "m-v3: m v3 aborted (1 failed devices > 0 allowed)"
    wait_for(browser, lambda d: aborted in text_of(d, "#rollouts"))
    first, second = rows_of(browser, "#waves-m-v3 tr")
    wave1 = target_order(BAD_ROLLOUT, NAMES)[:2]
    assert first.startswith("wave 1 (40%) aborted "), first
    assert f"{BROKEN}: failed, rolled_back" in first, first
    # The other one was sent the version too (answered or not by the abort): rolled back.
    assert all(re.search(rf"{d}: \w+, rolled_back", first) for d in wave1), first
    assert second.startswith("wave 2 (100%) not_run "), second
    assert ": pending" in second
    span = browser.find_element(
        By.XPATH, f'//*[@id="waves-m-v3"]//span[starts-with(., "{BROKEN}:")]'
    )
    assert "load_failed" in str(span.get_attribute("title"))
    assert all(d.serving() == [2] for d in fleet.values())
    # The devices' own events (the activations) reach the feed.
    assert any(" m 2 " in f" {r} " for r in rows_of(browser, "#events-body tr"))
    assert browser.execute_script("return window.notReloaded === true;")
    screenshots(browser, "dashboard")

    # A device's row opens its last telemetry, from the keyboard.
    link = browser.find_element(By.CSS_SELECTOR, 'a.device[data-device="dev2"]')
    link.send_keys(Keys.ENTER)
    wait_for(browser, lambda d: '"device": "dev2"' in text_of(d, "#telemetry-json"))
    assert '"kind": "telemetry"' in text_of(browser, "#telemetry-json")
    assert browser.execute_script("return document.activeElement.id;") == "telemetry-json"


def test_with_a_token_every_route_answers_401_without_it(broker: Broker) -> None:
    dashboard = Dashboard(broker.settings(), token="s3cret")
    loop = asyncio.new_event_loop()
    port = loop.run_until_complete(dashboard.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        for path in ("/", "/fleet/v1/state", "/fleet/v1/devices/dev1/telemetry"):
            for headers in ({}, {"Authorization": "Bearer s3cre"}):
                assert http_get(base + path, headers) == (401, UNAUTHORIZED)
            assert http_get(base + path + "?token=nope") == (401, UNAUTHORIZED)
        status, body = http_get(base + "/fleet/v1/state", {"Authorization": "Bearer s3cret"})
        assert status == 200
        assert b'"access":"token"' in body
        assert http_get(base + "/?token=s3cret")[0] == 200
        # A device never heard from: 404 with a JSON error, once the token is right.
        status, body = http_get(base + "/fleet/v1/devices/nobody/telemetry?token=s3cret")
        assert status == 404
        assert b"nobody" in body
    finally:
        asyncio.run_coroutine_threadsafe(dashboard.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_cli_serves_the_dashboard_until_sigterm(broker: Broker, tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "rollouts.sqlite"
    command = [sys.executable, "-m", "agent", "fleet", "dashboard", "--port", str(port),
               "--mqtt-port", str(broker.port), "--rollouts", str(db)]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == f"fleet dashboard on http://127.0.0.1:{port}/"
            status, body = http_get(f"http://127.0.0.1:{port}/fleet/v1/state")
            assert status == 200
            assert json.loads(body)["access"] == "open"
            assert json.loads(body)["rollouts"] == []
            assert not db.exists()  # read-only: the manager creates its file
        finally:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_the_cli_refuses_to_open_the_dashboard_beyond_loopback_without_a_token() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent", "fleet", "dashboard", "--bind", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != "EDGE_AGENT_DASHBOARD_TOKEN"},
    )  # fmt: skip
    assert done.returncode == 2
    assert "beyond loopback: set --token" in done.stderr
