"""The fleet dashboard (`edge-agent fleet dashboard`) with real agents on a Mosquitto broker,
in a real browser: three agents, a rollout moving wave by wave (through the `RolloutSource`
interface), a device's telemetry opened from the keyboard, and the token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.fleet.dashboard import Dashboard
from agent.pages import UNAUTHORIZED
from tests.models import scale_model, write_versions
from tests.mqtt.support import Broker, mqtt_config
from tests.pages.browser import (
    browser_fixture,
    first_paint_ms,
    rows_of,
    screenshots,
    text_of,
    wait_for,
)
from tests.server import AgentOnThread, agent_on_thread, http_client
from tests.support import free_port

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
        return [{"id": "r1", "model": "s", "version": 2, "state": self.state,
                 "reason": self.reason, "waves": self.waves}]  # fmt: skip

    def groups(self) -> dict[str, list[str]]:
        return {"dev1": ["canary", "lab"], "dev2": ["lab"], "dev3": ["field"]}


@pytest.fixture
def agents(broker: Broker, tmp_path: Path) -> Iterator[list[AgentOnThread]]:
    """Three agents, each serving model s version 1 and linked to the broker as dev1..dev3."""
    with contextlib.ExitStack() as stack:
        started = []
        for device in DEVICES:
            repo = tmp_path / device / "models"
            write_versions(repo, "s", {1: scale_model(2.0)})
            config = AgentConfig(
                server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
                models=ModelsConfig(repository=repo, intra_op_threads=1,
                                    control_mode="explicit", load_models=("*",)),
                mqtt=mqtt_config(broker, device_id=device, state_dir=tmp_path / device),
            )  # fmt: skip
            started.append(stack.enter_context(agent_on_thread(config)))
        yield started


@pytest.fixture
def board(agents: list[AgentOnThread], broker: Broker) -> Iterator[tuple[Dashboard, Rollouts, str]]:
    rollouts = Rollouts()
    dashboard = Dashboard(broker.settings(), rollouts=rollouts)
    port = agents[0].run(dashboard.start("127.0.0.1", 0))
    try:
        yield dashboard, rollouts, f"http://127.0.0.1:{port}/"
    finally:
        agents[0].run(dashboard.stop())


def _rows(driver: Any, css: str) -> list[str]:
    return rows_of(driver, css)


def _online(driver: Any) -> bool:
    rows = _rows(driver, "#devices-body tr")
    return len(rows) == 3 and all(" online " in f" {r} " for r in rows)


def test_the_dashboard_shows_three_devices_a_rollout_moving_and_a_devices_telemetry(
    browser: Any,
    agents: list[AgentOnThread],
    board: tuple[Dashboard, Rollouts, str],
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _, rollouts, url = board
    browser.get(url)
    print(f"fleet dashboard: first contentful paint {first_paint_ms(browser):.1f} ms")
    wait_for(browser, _online)
    rows = _rows(browser, "#devices-body tr")
    assert rows[0].startswith("dev1 online canary, lab s: 1 "), rows
    # Requests to dev1: its p95 (ms) and error rate arrive with its next telemetry.
    with http_client(agents[0].agent) as client:
        for _ in range(10):
            tensor = httpclient.InferInput("X", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            client.infer("s", [tensor])
    p95 = re.compile(r"^dev1 online canary, lab s: 1 \d+\.\d\d 0\.00 % ")
    wait_for(browser, lambda d: p95.match(_rows(d, "#devices-body tr")[0]))
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

    # dev3 loads a version 2 (a hot swap): its events reach the feed, its row shows it.
    shutil.copytree(tmp_path / "dev3/models/s/1", tmp_path / "dev3/models/s/2")
    with http_client(agents[2].agent) as client:
        client.load_model("s")
    wait_for(browser, lambda d: any(r.startswith("dev3 online field s: 1, 2")
                                    for r in _rows(d, "#devices-body tr")))  # fmt: skip
    assert any("dev3" in r and " s 2 " in r for r in _rows(browser, "#events-body tr"))
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
        asyncio.run_coroutine_threadsafe(dashboard.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_cli_serves_the_dashboard_until_sigterm(broker: Broker) -> None:
    port = free_port()
    command = [sys.executable, "-m", "agent", "fleet", "dashboard", "--port", str(port),
               "--mqtt-port", str(broker.port)]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == f"fleet dashboard on http://127.0.0.1:{port}/"
            status, body = _get(f"http://127.0.0.1:{port}/fleet/v1/state")
            assert status == 200
            assert json.loads(body)["access"] == "open"
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
