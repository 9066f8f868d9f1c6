"""`edge-agent fleet exporter`: the fleet's telemetry as Prometheus metrics.

Telemetry arrives through an MQTT shared subscription (`$share/GROUP/PREFIX/+/telemetry`), so
each message goes to one exporter of the group and ingestion scales with the processes. The
exporters find each other through presence messages (`PREFIX/_exporters/NAME`, retained and
repeated every few seconds, cleared by the last will and on a clean stop) and split the devices
by rendezvous hashing over the live names: each exporter serves the devices it owns, so the
union of the exporters serves every device once, and adding one moves only its share. A
message the broker handed to an exporter that does not own its device is passed on once to the
owner (`PREFIX/_exporters/OWNER/inbox`): the broker's choice (round robin, random, sticky) does
not matter. Without shared subscriptions (MQTT 3.1.1) every exporter reads every message and
keeps its own devices'. Statuses (for the `group` label) are read by every exporter.

Metrics (labels `device`, `group` = the device's first group, and per model `model`, `version`):

    edge_fleet_device_up, edge_fleet_device_info{groups, agent_version}
    edge_fleet_uptime_seconds, edge_fleet_memory_used_bytes, edge_fleet_outbox_queued
    edge_fleet_requests_total, edge_fleet_failures_total, edge_fleet_latency_p95_seconds,
    edge_fleet_latency_p99_seconds, edge_fleet_inferences_per_second
    edge_fleet_exporter_devices (devices this exporter serves), edge_fleet_exporter_peers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any, TextIO

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from agent.manager.devices import Fleet
from agent.wire.mqtt import Message, MqttClient, MqttSettings, Will, random_client_id

logger = logging.getLogger(__name__)

PRESENCE_EVERY_S = 5.0  # presence is re-published (3.1.1 brokers may not send it retained)
PEER_TTL_S = 3 * PRESENCE_EVERY_S  # a peer not heard from for this long is gone


def owner(device: str, peers: list[str]) -> str | None:
    """The exporter that serves `device`: rendezvous (highest random weight) hashing."""
    if not peers:
        return None
    return max(peers, key=lambda p: hashlib.sha256(f"{p}/{device}".encode()).digest())


class FleetMetrics:
    """The newest telemetry per device and the statuses; a Prometheus collector."""

    def __init__(self, name: str, stale_s: float) -> None:
        self.name = name
        self.stale_s = stale_s
        self.fleet = Fleet()
        self.telemetry: dict[str, tuple[float, dict[str, Any]]] = {}
        self.peers: dict[str, float] = {name: time.time()}

    def take(self, topic: str, doc: dict[str, Any]) -> None:
        """A status, telemetry or presence message."""
        parts = topic.split("/")
        if len(parts) >= 2 and parts[-2] == "_exporters":
            if doc.get("state") == "up":
                self.peers[parts[-1]] = time.time()
            else:
                self.peers.pop(parts[-1], None)
            return
        kind = doc.get("kind")
        if kind == "status":
            self.fleet.update(doc)
        elif kind == "telemetry" and isinstance(doc.get("device"), str):
            self.telemetry[doc["device"]] = (time.monotonic(), doc)

    def live_peers(self) -> list[str]:
        """The exporters heard from lately, this one included."""
        now = time.time()
        self.peers[self.name] = now
        return sorted(p for p, seen in self.peers.items() if now - seen <= PEER_TTL_S)

    def owner(self, device: str) -> str | None:
        """The exporter that serves `device` now."""
        return owner(device, self.live_peers())

    def served(self) -> list[str]:
        """The devices this exporter serves now (owned, not stale)."""
        now = time.monotonic()
        peers = self.live_peers()
        return sorted(
            d
            for d, (seen, _doc) in self.telemetry.items()
            if now - seen <= self.stale_s and owner(d, peers) == self.name
        )

    def collect(self) -> Iterator[Metric]:
        """The Prometheus collector protocol."""
        devices = self.served()
        dev = ["device", "group"]
        model = [*dev, "model", "version"]
        up = GaugeMetricFamily("edge_fleet_device_up", "1 while the device is online", labels=dev)
        info = GaugeMetricFamily(
            "edge_fleet_device_info",
            "the device's groups and agent",
            labels=[*dev, "groups", "agent_version"],
        )
        uptime = GaugeMetricFamily("edge_fleet_uptime_seconds", "fleet link uptime", labels=dev)
        memory = GaugeMetricFamily("edge_fleet_memory_used_bytes", "memory budget used", labels=dev)
        outbox = GaugeMetricFamily("edge_fleet_outbox_queued", "messages waiting", labels=dev)
        requests = CounterMetricFamily("edge_fleet_requests", "inference requests", labels=model)
        failures = CounterMetricFamily("edge_fleet_failures", "failed requests", labels=model)
        p95 = GaugeMetricFamily("edge_fleet_latency_p95_seconds", "request p95", labels=model)
        p99 = GaugeMetricFamily("edge_fleet_latency_p99_seconds", "request p99", labels=model)
        rate = GaugeMetricFamily("edge_fleet_inferences_per_second", "throughput", labels=model)
        for device in devices:
            doc = self.telemetry[device][1]
            view = self.fleet.devices.get(device)
            groups = list(view.groups) if view else []
            labels = [device, groups[0] if groups else ""]
            up.add_metric(labels, 1.0 if view is None or view.online else 0.0)
            agent = view.agent_version if view else ""
            info.add_metric([*labels, ",".join(groups), agent], 1.0)
            uptime.add_metric(labels, float(doc.get("uptime_s") or 0))
            used = (doc.get("memory") or {}).get("used_bytes")
            if isinstance(used, (int, float)):
                memory.add_metric(labels, float(used))
            queued = (doc.get("outbox") or {}).get("queued")
            if isinstance(queued, (int, float)):
                outbox.add_metric(labels, float(queued))
            for entry in doc.get("models") or []:
                row = [*labels, str(entry.get("model")), str(entry.get("version"))]
                requests.add_metric(row, float(entry.get("requests") or 0))
                failures.add_metric(row, float(entry.get("failures") or 0))
                latency = entry.get("latency_us") or {}
                for family, key in ((p95, "p95"), (p99, "p99")):
                    if latency.get(key) is not None:
                        family.add_metric(row, float(latency[key]) / 1e6)
                if entry.get("inferences_per_s") is not None:
                    rate.add_metric(row, float(entry["inferences_per_s"]))
        served = GaugeMetricFamily("edge_fleet_exporter_devices", "devices served here")
        served.add_metric([], float(len(devices)))
        peers = GaugeMetricFamily("edge_fleet_exporter_peers", "exporters sharing the fleet")
        peers.add_metric([], float(len(self.peers)))
        yield from (up, info, uptime, memory, outbox, requests, failures, p95, p99, rate)
        yield from (served, peers)


class Exporter:
    """One exporter process's MQTT side (see module docstring); `metrics` is its collector."""

    def __init__(
        self, settings: MqttSettings, prefix: str, *, share: str, name: str, stale_s: float
    ) -> None:
        self.prefix = prefix
        self.share = share
        self.metrics = FleetMetrics(name, stale_s)
        self.presence = f"{prefix}/_exporters/{name}"
        self.inbox = f"{self.presence}/inbox"
        self.shared = False
        self.handed_over = 0  # messages passed on to their device's owner
        gone = json.dumps({"state": "down"}).encode()
        settings = dataclasses.replace(
            settings, client_id=name, will=Will(self.presence, gone), persistent_session=False
        )
        self.client = MqttClient(settings, on_message=self._on_message)
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect, subscribe and announce this exporter."""
        await self.client.start()
        await self.client.wait_connected()
        p = self.prefix
        # MQTT 3.1.1 has no shared subscriptions (RabbitMQ would take `$share/...` as a plain
        # topic): every exporter then reads all telemetry and still serves only its devices.
        telemetry = f"{p}/+/telemetry"
        self.shared = self.client.protocol == "5"
        if self.shared:
            telemetry = f"$share/{self.share}/{telemetry}"
        await asyncio.gather(
            self.client.subscribe(telemetry, qos=0),
            self.client.subscribe(self.inbox, qos=0),
            self.client.subscribe(f"{p}/+/status"),
            self.client.subscribe(f"{p}/_exporters/+"),
        )
        if not self.shared:  # 3.1.1 brokers may not send retained statuses to `+/status`
            await self.client.publish(f"{p}/_fleet/rebirth", b'{"schema": 1}')
        await self.client.publish(self.presence, json.dumps({"state": "up"}).encode(), retain=True)
        self._heartbeat = asyncio.create_task(self._announce())

    async def _announce(self) -> None:
        while True:
            await asyncio.sleep(PRESENCE_EVERY_S)
            with contextlib.suppress(Exception):  # the broker is away: the next beat tries again
                up = json.dumps({"state": "up"}).encode()
                await self.client.publish(self.presence, up, retain=True)

    async def stop(self) -> None:
        """Withdraw the presence (the others take over its devices) and disconnect."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.publish(self.presence, b"", retain=True), 2.0)
        await self.client.stop()

    def _on_message(self, message: Message) -> None:
        if message.topic.startswith(f"{self.prefix}/_exporters/") and not message.payload:
            self.metrics.take(message.topic, {"state": "down"})
            return
        doc = message.json_object()
        if doc is None:
            return
        device = doc.get("device")
        if doc.get("kind") == "telemetry" and isinstance(device, str):
            home = self.metrics.owner(device)
            if home not in (None, self.metrics.name):
                if self.shared and message.topic != self.inbox:  # the owner did not get it
                    self.handed_over += 1
                    inbox = f"{self.prefix}/_exporters/{home}/inbox"
                    done = self.client.publish(inbox, message.payload, qos=0)
                    done.add_done_callback(lambda f: f.cancelled() or f.exception())
                return
        self.metrics.take(message.topic, doc)


async def serve(settings: MqttSettings, args: argparse.Namespace, out: TextIO) -> int:
    """Run an exporter until interrupted."""
    name = args.name or random_client_id(f"exporter-{socket.gethostname()[:20]}")
    exporter = Exporter(settings, args.prefix, share=args.share, name=name, stale_s=args.stale)
    registry = CollectorRegistry()
    registry.register(exporter.metrics)
    server, thread = start_http_server(args.http_port, args.bind, registry)
    await exporter.start()
    print(f"exporter {name}: http://{args.bind}:{args.http_port}/metrics", file=out, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await exporter.stop()
        server.shutdown()
        thread.join(5)
    return 0
