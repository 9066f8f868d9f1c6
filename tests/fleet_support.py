"""Many real agents on one broker, for the fleet-scale tests (rollouts, inventory, exporters).

Each device is a real agent (its own event loop thread, model cache and fleet link) serving
model m from a cache that holds version 1 (active), 2 and 3; version 3 is broken (not an ONNX
file) on the devices named `broken`, so it fails to load there and the old version serves on.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cli import main as cli_main
from agent.fleet.inventory import cache_digests
from agent.fleet.link import FleetLink
from agent.runtime.demo import mlp_model
from model_cache import ModelCache
from tests.models import M_CONFIG, write_model
from tests.mqtt_support import (
    AgentThread,
    Broker,
    _accepts,
    agent_config,
    agent_thread,
    mqtt_config,
)
from tests.support import free_port, wait_until


@dataclass
class Device:
    """One running agent with its fleet link."""

    name: str
    groups: tuple[str, ...]
    running: AgentThread
    link: FleetLink

    def serving(self) -> list[int]:
        """The versions of m this agent serves now."""
        served = {s.name: sorted(s.versions) for s in self.running.agent.registry.served_models()}
        return served.get("m", [])


def build_sources(root: Path) -> dict[str, Path]:
    """Model folders of m: versions 1-3, and a broken version 3 (not an ONNX file)."""
    sources = {}
    for version in (1, 2, 3):
        write_model(root / f"v{version}", "m", mlp_model(seed=version), M_CONFIG, (version,))
        sources[str(version)] = root / f"v{version}/m"
    write_model(root / "bad3", "m", mlp_model(seed=3), M_CONFIG, (3,))
    (root / "bad3/m/3/model.onnx").write_bytes(b"not an onnx model")
    sources["bad3"] = root / "bad3/m"
    return sources


def build_device_cache(root: Path, sources: dict[str, Path], broken: bool) -> Path:
    cache = ModelCache(root / "cache")
    try:
        cache.install("m", 1, sources["1"])
        cache.activate("m", 1)
        cache.install("m", 2, sources["2"])
        cache.install("m", 3, sources["bad3" if broken else "3"])
    finally:
        cache.close()
    return root / "cache"


@contextlib.contextmanager
def run_fleet(
    broker: Broker,
    root: Path,
    groups: Mapping[str, tuple[str, ...]],
    broken: set[str],
    **mqtt: Any,
) -> Iterator[dict[str, Device]]:
    """Start one agent per device (in parallel); stop them all at the end."""
    sources = build_sources(root / "sources")
    stack = contextlib.ExitStack()

    def start(name: str) -> Device:
        cache = build_device_cache(root / name, sources, name in broken)
        running = stack.enter_context(agent_thread(agent_config(cache)))
        agent = running.agent
        assert agent.model_cache is not None
        config = mqtt_config(
            broker,
            device_id=name,
            groups=groups[name],
            telemetry_interval_ms=mqtt.get("telemetry_interval_ms", 500),
            protocol=mqtt.get("protocol", "auto"),
        )
        link = FleetLink(
            config,
            agent.dataplane,
            agent.registry,
            agent.registry.ledger,
            root / name / "fleet.sqlite",
            cache_disk=agent.model_cache.disk_usage,
            digests=cache_digests(agent.model_cache),
        )
        running.run(link.start())
        running.events.add(link)
        stack.callback(running.run, link.stop())
        return Device(name, groups[name], running, link)

    with stack:
        with ThreadPoolExecutor(8) as pool:
            devices = {d.name: d for d in pool.map(start, sorted(groups))}
        for device in devices.values():
            device.running.run(device.link.wait_subscribed(), 30)
        yield devices


def fleet_cli(broker: Broker, *argv: str) -> tuple[int, str]:
    """Run `edge-agent fleet ...` in this process; (exit code, what it printed)."""
    out = io.StringIO()
    common = ["--host", "127.0.0.1", "--port", str(broker.port)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(["fleet", *argv, *common])
    return code, out.getvalue()


def fleet_process(broker: Broker, *argv: str, log: Path) -> subprocess.Popen[bytes]:
    """Run `edge-agent fleet ...` as its own process (to kill it)."""
    common = ["--host", "127.0.0.1", "--port", str(broker.port)]
    code = "import sys; from agent.cli import main; sys.exit(main())"
    handle = log.open("wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-c", code, "fleet", *argv, *common], stdout=handle, stderr=handle
        )
    finally:
        handle.close()


def table(rows: Sequence[Sequence[object]]) -> str:
    """A plain table for the figures the tests print."""
    text = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(text[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in text)


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # Debian's, without su


def rabbitmq_missing() -> str | None:
    """None when RabbitMQ's server can be started here, else why not."""
    if RABBITMQ_SERVER.exists() and shutil.which("epmd"):
        return None
    return "rabbitmq-server is not installed (make test installs it where apt-get can)"


class RabbitBroker(Broker):
    """RabbitMQ with its MQTT plugin (MQTT 3.1.1) on free loopback ports, its own epmd, node
    name, files and cookie; stopped by process group (only the processes it started)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.epmd: subprocess.Popen[bytes] | None = None
        epmd_port, dist_port = free_port(), free_port()
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp = none\nmqtt.listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "mqtt.allow_anonymous = true\nloopback_users = none\n"
        )
        (folder / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        self.env = {
            **os.environ,
            "HOME": str(folder),
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"edge-test-{self.port}@localhost",
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_LOGS": "-",
        }

    def start(self) -> None:
        log = (self.folder / "broker.log").open("ab")
        try:
            epmd = shutil.which("epmd") or "epmd"
            port = self.env["ERL_EPMD_PORT"]
            self.epmd = subprocess.Popen([epmd, "-port", port], stdout=log, stderr=log)
            self.proc = subprocess.Popen(
                [str(RABBITMQ_SERVER)], stdout=log, stderr=log, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        wait_until(lambda: _accepts(self.port), "RabbitMQ's MQTT listener", timeout_s=120)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        if self.epmd is not None:
            self.epmd.terminate()
            self.epmd.wait(timeout=10)
            self.epmd = None


def elapsed(start: float) -> float:
    """Seconds since `start` (monotonic), rounded for a figure."""
    return round(time.monotonic() - start, 2)
