"""Killing the agent publishes its last will; restarting it publishes online again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.manager.cli import FleetClient
from agent.runtime.demo import mlp_model
from tests.models import M_CONFIG, write_model
from tests.mqtt_support import Broker


def launch(repo: Path, broker: Broker, state: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.link_process", str(repo), str(broker.port), str(state)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"  # bounded by the test's own timeout
    return proc


def test_kill_publishes_last_will_and_restart_online(broker: Broker, tmp_path: Path) -> None:
    write_model(tmp_path / "repo", "m", mlp_model(seed=1), M_CONFIG)
    state = tmp_path / "fleet.sqlite"

    async def status(fleet: FleetClient, state_name: str) -> dict[str, Any]:
        async with asyncio.timeout(30):
            async for message in fleet.messages():
                doc = json.loads(message.payload)
                if doc.get("kind") == "status" and doc["state"] == state_name:
                    return dict(doc)
        raise AssertionError("no status")

    async def scenario() -> None:
        async with FleetClient(broker.settings()) as fleet:
            await fleet.watch("killme")
            proc = await asyncio.to_thread(launch, tmp_path / "repo", broker, state)
            try:
                online = await status(fleet, "online")
                assert online["models"] == [{"name": "m", "versions": [1]}]
                os.kill(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait, 10)
                will = await status(fleet, "offline")
                assert will["reason"] == "connection lost"
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()
            again = await asyncio.to_thread(launch, tmp_path / "repo", broker, state)
            try:
                await status(fleet, "online")
                again.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(again.wait, 30) == 0
                clean = await status(fleet, "offline")
                assert clean["reason"] == "stopped"
            finally:
                if again.poll() is None:
                    again.kill()
                    again.wait()
                assert again.stdout is not None
                again.stdout.close()

    asyncio.run(scenario())
