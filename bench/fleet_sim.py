"""Thousands of simulated devices in one process, against a real broker.

    python -m bench.fleet_sim --devices 10000 --port 1883 [--telemetry 10s] [--control-port P]
        [--brokers 127.0.0.1:1884,127.0.0.1:1885] [--regress-share 0.05 --regress-version 3]
        [--broken-share 0.01 --broken-version 3] [--regress-devices FILE] [--protocol 3.1.1]

Each device (`bench.sim_device.SimDevice`) is one MQTT connection through the agent's own
adapter, `agent.wire.mqtt.MqttClient`, with paho's network side on this event loop
(`agent.wire.mqtt_loop.LoopNetwork`) instead of a thread per client: one process holds 10,000
connections in about 55 MiB. Devices connect at most 64 at a time (a broker's listen backlog),
then each publishes its retained status, subscribes to its commands and to the fleet-wide
rebirth topic, and sends telemetry every `telemetry_s`, the fleet's messages spread evenly over
the interval. With several brokers (the nodes of a cluster), device `i` connects to node
`i % n` first and fails over to the others in turn.

The control port answers `GET /summary`: how many devices are connected, which version each
serves, and every command each one executed (`bench.fleet10k` reads it to account for each
device). SIGTERM (or Ctrl-C) disconnects every device cleanly and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import logging
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.fleet.documents import offline_status
from agent.fleet.slo import SloEvaluator, parse_slo_targets
from agent.wire.mqtt import MqttClient, MqttSettings, Protocol, Will
from agent.wire.mqtt_loop import LoopNetwork
from agent.wire.topics import Topics
from bench.sim_device import Profile, SimDevice, share_of

logger = logging.getLogger(__name__)

_TICK_S = 0.1  # telemetry goes out in slots of this length


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Where the simulated fleet connects, and how it is named and grouped."""

    devices: int
    brokers: tuple[tuple[str, int], ...] = (("127.0.0.1", 1883),)
    prefix: str = "edge"
    telemetry_s: float = 10.0
    protocol: Protocol = Protocol.AUTO
    sites: int = 4  # devices are in group "fleet" and in one of site-0 .. site-{sites-1}
    keepalive_s: int = 60
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 10.0
    seed: int = 7

    def names(self) -> list[str]:
        """The device ids: sim00000, sim00001, ..."""
        return [f"sim{i:05d}" for i in range(self.devices)]


class Simulator:
    """The simulated fleet on the running loop (see module docstring)."""

    def __init__(self, config: SimConfig, profile: Profile) -> None:
        self.config = config
        self.profile = profile
        self.devices: dict[str, SimDevice] = {}
        self._subscribed: list[asyncio.Future[None]] = []
        self._network: LoopNetwork | None = None
        self._telemetry: asyncio.Task[None] | None = None
        self.published_telemetry = 0
        self.started_at = 0.0

    async def start(self) -> None:
        """Create every device and start connecting them (returns before they are all up)."""
        c = self.config
        self._network = LoopNetwork(seed=c.seed)
        self.started_at = time.time()
        rng = random.Random(c.seed)
        targets = parse_slo_targets(self.profile.slo)
        for i, name in enumerate(c.names()):
            device = SimDevice(
                name=name,
                groups=("fleet", f"site-{i % c.sites}"),
                profile=self.profile,
                topics=Topics(c.prefix, name),
                started=self.started_at,
                serving=self.profile.serving,
                slo=SloEvaluator(targets),
                jitter=random.Random(rng.random()),
            )
            first = c.brokers[i % len(c.brokers)]
            rest = tuple(c.brokers[(i + k) % len(c.brokers)] for k in range(1, len(c.brokers)))
            settings = MqttSettings(
                host=first[0],
                port=first[1],
                brokers=rest,
                client_id=name,
                protocol=c.protocol,
                keepalive_s=c.keepalive_s,
                reconnect_min_s=c.reconnect_min_s,
                reconnect_max_s=c.reconnect_max_s,
                will=Will(device.topics.status, _offline(device, "connection lost")),
            )
            client = MqttClient(
                settings,
                on_message=device.on_message,
                on_connected=_on_connected(device),
                network=self._network,
            )
            device.client = client
            self.devices[name] = device
            await client.start()
            self._subscribed.append(client.subscribe(device.topics.commands))
            _quiet(client.subscribe(device.topics.rebirth_all))
        self._telemetry = asyncio.create_task(self._telemetry_loop())

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until every device's command subscription is acknowledged.

        Raises:
            TimeoutError: not all within `timeout_s`.
        """
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(asyncio.shield(f) for f in self._subscribed))

    def connected(self) -> int:
        """Devices connected now."""
        return sum(1 for d in self.devices.values() if d.client and d.client.connected)

    async def stop(self) -> None:
        """Publish each device's `offline` ("stopped") status and disconnect them all cleanly."""
        if self._telemetry is not None:
            self._telemetry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._telemetry
        goodbyes = []
        for device in self.devices.values():
            client = device.client
            if client is not None and client.connected:
                bye = _offline(device, "stopped")
                goodbyes.append(client.publish(device.topics.status, bye, retain=True))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*goodbyes, return_exceptions=True), 30)
        await asyncio.gather(*(d.client.stop() for d in self.devices.values() if d.client))

    def summary(self) -> dict[str, Any]:
        """What `GET /summary` answers (see module docstring)."""
        serving = collections.Counter(str(d.serving) for d in self.devices.values())
        brokers = collections.Counter(
            f"{d.client.broker[0]}:{d.client.broker[1]}"
            for d in self.devices.values()
            if d.client is not None and d.client.connected
        )
        return {
            "devices": len(self.devices),
            "connected": self.connected(),
            "connects": self._network.connects if self._network else 0,
            "connecting": self._network.waiting if self._network else (0, 0),
            "brokers": dict(sorted(brokers.items())),
            "serving": dict(sorted(serving.items())),
            "telemetry": self.published_telemetry,
            "duplicates": sum(d.duplicates for d in self.devices.values()),
            "failures": sum(d.client.failures for d in self.devices.values() if d.client),
            "log": {
                name: [[e.id, e.command, e.version, e.ok, round(e.at, 3)] for e in d.log]
                for name, d in self.devices.items()
                if d.log
            },
            "versions": {name: d.serving for name, d in self.devices.items()},
        }

    async def _telemetry_loop(self) -> None:
        interval = self.config.telemetry_s
        slots = max(1, round(interval / _TICK_S))
        by_slot: list[list[SimDevice]] = [[] for _ in range(slots)]
        for name, device in self.devices.items():
            digest = hashlib.sha256(name.encode()).digest()
            by_slot[int.from_bytes(digest[:4], "big") % slots].append(device)
        tick = interval / slots
        slot, next_at = 0, time.monotonic()
        while True:
            now, wall = time.monotonic(), time.time()
            for device in by_slot[slot]:
                client = device.client
                if client is None or not client.connected:
                    continue
                doc, samples = device.telemetry(wall, interval)
                device.send_telemetry(doc)
                self.published_telemetry += 1
                assert device.slo is not None
                for alert in device.slo.evaluate(now, samples):
                    device.event(alert.model, alert.version, alert.kind, dict(alert.figures), wall)
            slot = (slot + 1) % slots
            next_at = max(next_at + tick, time.monotonic() - tick)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def _offline(device: SimDevice, reason: str) -> bytes:
    return offline_status(device.name, time.time(), reason)


def _on_connected(device: SimDevice) -> Any:
    return lambda: device.publish_status(time.time())


def _quiet(future: asyncio.Future[None]) -> None:
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


# --- the process -------------------------------------------------------------------------------


def _duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


def _brokers(text: str) -> tuple[tuple[str, int], ...]:
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, _, port = item.rpartition(":")
        found.append((host or "127.0.0.1", int(port)))
    return tuple(found)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The simulator's command line (see module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--brokers", type=_brokers, default=(), help="HOST:PORT,... (a cluster)")
    parser.add_argument("--prefix", default="edge")
    parser.add_argument("--telemetry", type=_duration, default=10.0, help="interval (10s)")
    parser.add_argument("--protocol", choices=[p.value for p in Protocol], default="auto")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--serving", type=int, default=1, help="the version active at start")
    parser.add_argument("--regress-share", type=float, default=0.0)
    parser.add_argument("--regress-devices", type=Path, help="a file, one device id a line")
    parser.add_argument("--regress-version", type=int)
    parser.add_argument("--broken-share", type=float, default=0.0)
    parser.add_argument("--broken-devices", type=Path, help="a file, one device id a line")
    parser.add_argument("--broken-version", type=int)
    parser.add_argument("--salt", default="sim", help="picks the regressing and broken devices")
    parser.add_argument("--control-port", type=int, default=0)
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> tuple[SimConfig, Profile]:
    """The simulator's config and profile from its command line."""
    brokers = args.brokers or ((args.host, args.port),)
    config = SimConfig(devices=args.devices, brokers=brokers, prefix=args.prefix,
                       telemetry_s=args.telemetry, protocol=Protocol(args.protocol),
                       sites=args.sites)  # fmt: skip
    names = config.names()
    regress = share_of(names, args.regress_share, f"{args.salt}/regress")
    broken = share_of(names, args.broken_share, f"{args.salt}/broken")
    profile = Profile(
        serving=args.serving,
        regress=regress | _named(args.regress_devices),
        regress_version=args.regress_version,
        broken=broken | _named(args.broken_devices),
        broken_version=args.broken_version,
    )
    return config, profile


def _named(path: Path | None) -> frozenset[str]:
    if path is None:
        return frozenset()
    return frozenset(line.strip() for line in path.read_text().splitlines() if line.strip())


async def _serve(args: argparse.Namespace) -> int:
    simulator = Simulator(*config_of(args))
    started = time.monotonic()
    await simulator.start()

    async def summary(_request: web.Request) -> web.Response:
        return web.json_response(simulator.summary())

    app = web.Application()
    app.add_routes([web.get("/summary", summary)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.control_port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"control on http://127.0.0.1:{port}/summary", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await simulator.wait_ready(600)
        took = time.monotonic() - started
        print(f"simulator: {args.devices} devices connected in {took:.1f} s", flush=True)
        await stop.wait()
    finally:
        await simulator.stop()
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator until SIGTERM."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # 10,000 devices losing a broker would log 10,000 lines: the summary counts them instead.
    logging.getLogger("agent.wire.mqtt").setLevel(logging.ERROR)
    logging.getLogger("agent.wire.mqtt.paho").setLevel(logging.CRITICAL)  # "connection reset"
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
