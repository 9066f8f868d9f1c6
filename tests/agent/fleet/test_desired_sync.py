"""The fleet's `set-desired` changes what the running agent's sync holds and serves; the
`sync` command and the telemetry use the same sync loop as the schedule.

Through the daemon's own wiring: a real agent with `[cache]`, `[sync]` (a signed repository on a
folder store) and `[mqtt]` (a real broker); the fleet side sends commands with `FleetClient`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.manager.cli import FleetClient
from agent.runtime.demo import mlp_model
from sync.config import SyncConfig
from sync.keys import init_keys
from sync.publish import Publisher
from sync.store import FileStore
from tests.models import M_CONFIG, write_model
from tests.mqtt_support import Broker, first, is_kind, mqtt_config
from tests.server import agent_on_thread
from tests.support import wait_until


def _served_version(port: int) -> str | None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/m/infer", data=json.dumps(doc).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(json.loads(resp.read())["model_version"])
    except urllib.error.HTTPError:
        return None


def test_set_desired_over_mqtt_changes_what_the_running_sync_serves(
    tmp_path: Path, broker: Broker
) -> None:
    repo = tmp_path / "repo"
    init_keys(repo, {})
    bucket = tmp_path / "bucket"
    publisher = Publisher(repo, FileStore(bucket))
    for version in (1, 2):
        source = tmp_path / f"src{version}"
        write_model(source, "m", mlp_model(seed=version), M_CONFIG, (version,))
        publisher.publish("m", version, source / "m")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(intra_op_threads=1),
        cache=CacheConfig(dir=tmp_path / "cache"),
        sync=SyncConfig(
            source=bucket.as_uri(),
            trusted_root=repo / "metadata" / "root.json",
            interval_s=3600,  # only the first cycle runs by itself; the rest are commands
            jitter_s=0,
        ),
        mqtt=mqtt_config(broker),
    )

    async def send(command: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        async with FleetClient(broker.settings()) as fleet:
            async with asyncio.timeout(60):
                return await fleet.send("dev1", command, args or {})

    with agent_on_thread(config) as running:
        port = running.agent.http_port
        wait_until(lambda: _served_version(port) == "2", "the first cycle serves latest (2)")
        fleet = running.agent.fleet
        assert fleet is not None
        running.run(fleet.wait_subscribed(), timeout=20)
        pinned = asyncio.run(send("set-desired", {"models": {"m": "1"}}))
        assert pinned["ok"], pinned
        synced = asyncio.run(send("sync"))
        assert synced["ok"], synced
        assert ["m", 1] in synced["result"]["activated"]
        assert _served_version(port) == "1"
        asyncio.run(send("set-desired", {"models": {"*": "latest"}}))
        synced = asyncio.run(send("sync"))
        assert ["m", 2] in synced["result"]["activated"], synced
        assert synced["result"]["rejected"] == []
        assert _served_version(port) == "2"
        # The same sync loop reports in telemetry: what serves and why.
        telemetry = asyncio.run(_next_telemetry(broker))
        assert telemetry["sync"]["failing"] is None
        assert telemetry["sync"]["serving"]["m"]["version"] == 2


async def _next_telemetry(broker: Broker) -> dict[str, Any]:
    async with FleetClient(broker.settings()) as fleet:
        async with asyncio.timeout(30):
            await fleet.watch("dev1")
            return await first(fleet.messages(), is_kind("telemetry"))
