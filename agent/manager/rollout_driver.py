"""Drives a stored rollout over MQTT: the I/O around `agent.manager.rollout.Rollout`.

    async with FleetConnection(settings, prefix, name="rollout-r1") as conn:
        await conn.settle(1.0)                       # the retained statuses: the inventory
        rollout = store.create(Rollout.start(spec, conn.fleet.devices, time.time()), now)
        await drive(conn, store, rollout.spec.id)

`FleetConnection` subscribes to every device's status and telemetry and to its own reply topic
(MQTT 5 response topic; under 3.1.1 the devices' `responses` topics, matched by command id).
Its client id is fixed per rollout with a persistent session, so responses published while the
manager is down are delivered when it comes back. `drive` resends the commands of the step the
last driver had not finished (the same ids: devices answer them from their record), then loops:
operator requests, incoming messages, `step`, publish, store state and events in one
transaction, heartbeat, until the rollout is done or `stop` is set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from agent.manager.devices import Fleet
from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import Send
from agent.manager.rollout_store import RolloutStore
from agent.wire.mqtt import Message, MqttClient, MqttSettings

logger = logging.getLogger(__name__)

_INBOX = 100_000  # messages buffered between ticks (a tick drains them all)


class FleetConnection:
    """Statuses, telemetry and command responses of the whole fleet (see module docstring)."""

    def __init__(
        self, settings: MqttSettings, prefix: str, *, name: str, persistent: bool = True
    ) -> None:
        self.prefix = prefix
        self.fleet = Fleet()
        self.reply_topic = f"{prefix}/_fleet/{name}/replies"
        settings = dataclasses.replace(settings, client_id=name, persistent_session=persistent)
        self.client = MqttClient(settings, on_message=self._on_message)
        self.inbox: deque[tuple[str, dict[str, Any]]] = deque(maxlen=_INBOX)
        self.received = 0
        self.sent = 0
        self._last_status = 0.0

    async def __aenter__(self) -> FleetConnection:
        await self.client.start()
        # `+/responses` too: under 3.1.1 (known only once connected) replies land there.
        leaves = ("status", "telemetry", "responses")
        topics = [*(f"{self.prefix}/+/{leaf}" for leaf in leaves), self.reply_topic]
        await asyncio.gather(*(self.client.subscribe(t) for t in topics))
        if self.client.protocol != "5":
            # 3.1.1 brokers such as RabbitMQ's plugin send retained messages only to exact
            # topics, not to `+/status`: ask every device to publish its status again.
            self.request_rebirth()
        return self

    def request_rebirth(self) -> None:
        """Ask every device to re-publish its status (`PREFIX/_fleet/rebirth`)."""
        future = self.client.publish(f"{self.prefix}/_fleet/rebirth", b'{"schema": 1}')
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def __aexit__(self, *_exc: object) -> None:
        await self.client.stop()

    async def settle(self, quiet_s: float, limit_s: float = 30.0) -> None:
        """Wait until no status arrived for `quiet_s` (the retained ones come first)."""
        self._last_status = time.monotonic()
        async with asyncio.timeout(limit_s):
            while time.monotonic() - self._last_status < quiet_s:
                self.drain(None)
                await asyncio.sleep(min(0.05, quiet_s))
        self.drain(None)

    def publish(self, send: Send) -> None:
        """Publish a command (QoS 1; paho keeps it across reconnects)."""
        doc = {"schema": 1, "id": send.command_id, "command": send.command}
        if send.args:
            doc["args"] = dict(send.args)
        topic = f"{self.prefix}/{send.device}/commands"
        future = self.client.publish(
            topic,
            json.dumps(doc).encode(),
            response_topic=self.reply_topic,
            correlation_data=send.command_id.encode(),
        )
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.sent += 1

    def drain(self, rollout: Rollout | None) -> None:
        """Feed what arrived into the fleet view and the rollout."""
        while self.inbox:
            kind, doc = self.inbox.popleft()
            device = str(doc.get("device") or "")
            if kind == "status":
                self.fleet.update(doc)
            elif rollout is not None and kind == "telemetry":
                rollout.on_telemetry(device, doc)
            elif rollout is not None and kind == "response":
                command_id = str(doc.get("id") or "")
                if command_id.startswith(f"{rollout.spec.id}."):
                    rollout.on_response(device, command_id, doc)

    def _on_message(self, message: Message) -> None:
        doc = message.json_object()
        if doc is None:
            return
        self.received += 1
        leaf = message.topic.rsplit("/", 1)[-1]
        if leaf == "status":
            self._last_status = time.monotonic()
            self.inbox.append(("status", doc))
        elif leaf == "telemetry":
            self.inbox.append(("telemetry", doc))
        elif doc.get("kind") == "response":
            self.inbox.append(("response", doc))


async def drive(
    conn: FleetConnection,
    store: RolloutStore,
    rollout_id: str,
    *,
    tick_s: float = 0.2,
    clock: Callable[[], float] = time.time,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    stop: asyncio.Event | None = None,
) -> Rollout:
    """Run the stored rollout until it is done (or `stop` is set); returns its last state.

    Raises:
        KeyError: no rollout has this id.
    """
    rollout = store.load(rollout_id)
    if rollout is None:
        raise KeyError(rollout_id)
    conn.drain(rollout)
    for send in rollout.resend():
        conn.publish(send)
    pid = os.getpid()
    try:
        while True:
            now = clock()
            for action, _ts in store.take_requests(rollout_id):
                if action == "pause":
                    rollout.pause(now)
                elif action == "resume":
                    rollout.resume(now)
                else:
                    rollout.abort(now, "aborted by the operator")
            conn.drain(rollout)
            for send in rollout.step(conn.fleet.devices, now):
                conn.publish(send)
            for event in store.save(rollout, now):
                logger.info("rollout %s: %s", rollout_id, event["event"])
                if on_event is not None:
                    on_event(event)
            store.heartbeat(rollout_id, pid, now)
            if rollout.done or (stop is not None and stop.is_set()):
                return rollout
            await asyncio.sleep(tick_s)
    finally:
        store.heartbeat(rollout_id, None, clock())
