"""Drives a stored rollout over MQTT: the I/O around `agent.manager.rollout.Rollout`.

    async with FleetConnection(settings, prefix, name="rollout-r1") as conn:
        await conn.settle(1.0)                       # the retained statuses: the inventory
        rollout = store.create(Rollout.start(spec, conn.fleet.devices, time.time()), now)
        await drive(conn, store, rollout.spec.id)

`FleetConnection` subscribes to every device's status and to its own reply topic (MQTT 5
response topic; under 3.1.1 the devices' `responses` topics, matched by command id). Its client
id is fixed per rollout with a persistent session, so responses published while the manager is
down are delivered when it comes back. Telemetry is subscribed only while a wave soaks
(`want_telemetry`), at QoS 0: only what arrives during a soak counts, a broker must not queue
every device's telemetry for a manager that is away, and at 10,000 devices its 1,000 messages
a second slowed down the answers and statuses a deploying wave waits for. The connection keeps
up to 1,000 commands unacknowledged by the broker: with paho's default of 32 a wave of 4,000
commands left at the pace of the broker's round trips (bench/fleet10k.md). `settle` first waits
for a marker it publishes to itself, so the broker has delivered what it held when the
connection subscribed (the retained statuses, and answers queued in the session) before the
quiet time starts: at 10,000 devices that takes longer than the quiet time.

`drive` resends the commands of the step the last driver had not finished (the same ids:
devices answer them from their record), then loops: operator requests, incoming messages,
`step`, publish, store state and events in one transaction, heartbeat, until the rollout is
done or `stop` is set. The state is stored at every step that made a decision (an event),
sent commands or applied an operator's request, and at least every `save_every_s` otherwise:
what a step between saves changes (answers, confirmations, telemetry for the gate) is read
again after a restart (answers come again for the resent ids, statuses are retained), and
storing a 10,000-device rollout (2.9 MB of JSON) at every 0.2 s tick was the first thing that
stopped the manager keeping up (bench/fleet10k.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
import uuid
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
_MAX_INFLIGHT = 1000  # commands out before the broker's acknowledgements (paho's default: 32)
SETTLE_LIMIT_S = 300.0  # a loaded cluster took over a minute to deliver 3,000 statuses


class FleetConnection:
    """Statuses, telemetry and command responses of the whole fleet (see module docstring)."""

    def __init__(
        self,
        settings: MqttSettings,
        prefix: str,
        *,
        name: str,
        persistent: bool = True,
    ) -> None:
        self.prefix = prefix
        self._telemetry = f"{prefix}/+/telemetry"
        self.telemetry_wanted = False  # subscribed to telemetry (`want_telemetry`)
        self.fleet = Fleet()
        self.reply_topic = f"{prefix}/_fleet/{name}/replies"
        settings = dataclasses.replace(
            settings,
            client_id=name,
            persistent_session=persistent,
            max_inflight=max(settings.max_inflight, _MAX_INFLIGHT),
        )
        self.client = MqttClient(settings, on_message=self._on_message)
        self.inbox: deque[tuple[str, dict[str, Any]]] = deque(maxlen=_INBOX)
        self.received = 0
        self.sent = 0
        self._last_status = 0.0
        self._markers: dict[str, asyncio.Future[None]] = {}

    async def __aenter__(self) -> FleetConnection:
        await self.client.start()
        # `+/responses` too: under 3.1.1 (known only once connected) replies land there.
        topics = [f"{self.prefix}/+/{leaf}" for leaf in ("status", "responses")]
        await asyncio.gather(*(self.client.subscribe(t) for t in [*topics, self.reply_topic]))
        # Connected: drop a telemetry subscription an earlier driver left in the session.
        self.client.unsubscribe(self._telemetry)
        if self.client.protocol != "5":
            # 3.1.1 brokers such as RabbitMQ's plugin send retained messages only to exact
            # topics, not to `+/status`: ask every device to publish its status again.
            self.request_rebirth()
        return self

    def want_telemetry(self, wanted: bool) -> None:
        """Subscribe to every device's telemetry (QoS 0), or stop; idempotent."""
        if wanted == self.telemetry_wanted:
            return
        self.telemetry_wanted = wanted
        if wanted:
            done = self.client.subscribe(self._telemetry, qos=0)
            done.add_done_callback(lambda f: f.cancelled() or f.exception())
        else:
            self.client.unsubscribe(self._telemetry)

    def request_rebirth(self) -> None:
        """Ask every device to re-publish its status (`PREFIX/_fleet/rebirth`)."""
        future = self.client.publish(f"{self.prefix}/_fleet/rebirth", b'{"schema": 1}')
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def __aexit__(self, *_exc: object) -> None:
        await self.client.stop()

    async def settle(self, quiet_s: float, limit_s: float = SETTLE_LIMIT_S) -> None:
        """Wait until the broker delivered what it held for this connection (a marker sent to
        itself is back), then until no status arrived for `quiet_s`.

        Raises:
            TimeoutError: not settled within `limit_s` (the message says so).
        """
        marker = uuid.uuid4().hex
        back: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._markers[marker] = back
        doc = {"schema": 1, "kind": "marker", "id": marker}
        try:
            async with asyncio.timeout(limit_s):
                await self.client.publish(self.reply_topic, json.dumps(doc).encode())
                await back
                self._last_status = time.monotonic()
                while time.monotonic() - self._last_status < quiet_s:
                    self.drain(None)
                    await asyncio.sleep(min(0.05, quiet_s))
        except TimeoutError:
            raise TimeoutError(
                f"the broker did not deliver the devices' statuses within {limit_s:g} s"
            ) from None
        finally:
            self._markers.pop(marker, None)
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
        leaf = message.topic.rsplit("/", 1)[-1]
        if leaf == "telemetry" and not self.telemetry_wanted:
            self.received += 1
            return
        doc = message.json_object()
        if doc is None:
            return
        self.received += 1
        if leaf == "status":
            self._last_status = time.monotonic()
            self.inbox.append(("status", doc))
        elif leaf == "telemetry":
            self.inbox.append(("telemetry", doc))
        elif doc.get("kind") == "response":
            self.inbox.append(("response", doc))
        elif doc.get("kind") == "marker" and message.topic == self.reply_topic:
            back = self._markers.get(str(doc.get("id")))
            if back is not None and not back.done():
                back.set_result(None)


async def drive(
    conn: FleetConnection,
    store: RolloutStore,
    rollout_id: str,
    *,
    tick_s: float = 0.2,
    save_every_s: float = 1.0,
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
    saved = beat = -math.inf
    try:
        while True:
            now = clock()
            requests = store.take_requests(rollout_id)
            for action, _ts in requests:
                if action == "pause":
                    rollout.pause(now)
                elif action == "resume":
                    rollout.resume(now)
                else:
                    rollout.abort(now, "aborted by the operator")
            conn.want_telemetry(rollout.phase == "soaking")
            conn.drain(rollout)
            sends = rollout.step(conn.fleet.devices, now)
            for send in sends:
                conn.publish(send)
            finished = rollout.done or (stop is not None and stop.is_set())
            if requests or sends or rollout.events or finished or now - saved >= save_every_s:
                saved = now
                for event in store.save(rollout, now):
                    logger.info("rollout %s: %s", rollout_id, event["event"])
                    if on_event is not None:
                        on_event(event)
            if now - beat >= min(save_every_s, 1.0):
                beat = now
                store.heartbeat(rollout_id, pid, now)
            if finished:
                return rollout
            await asyncio.sleep(tick_s)
    finally:
        store.heartbeat(rollout_id, None, clock())
