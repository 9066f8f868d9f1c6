"""The fleet link: status, telemetry, events and commands between the agent and its fleet manager.

Topics (`{prefix}/{device}/...`, see docs/mqtt.md):
    status     retained; `online` on each connect (`degraded`, with the reason, while a part of
               the link or an event sink fails), `offline` on a clean stop, and the same
               `offline` document as the last will when the agent vanishes
    telemetry  every `telemetry_interval_ms`, through the outbox
    events     model events (this class is an `EventSink`) and SLO/drift alerts, through the outbox
    commands   subscribed, QoS 1; parsed, queued and answered by `agent.fleet.command_inbox`
    responses  the default reply topic (MQTT 5 response topic and correlation data win)

Invariants:
    * Inference never depends on the broker: the link only reads statistics and calls the data
      plane; all its publishing is asynchronous and bounded (outbox, command queue).
    * Telemetry and events leave in order through the bounded outbox (`agent.fleet.outbox`).
    * A command id executes at most once (`agent.fleet.state`); duplicates are answered with the
      stored response (`"duplicate": true`). Mutating commands run one at a time, in arrival
      order; `status` and `ping` are answered at once.
    * Every input problem becomes an error response (error → code table: `agent.fleet.executor`);
      an unexpected exception answers `internal`.
    * Failures are isolated and never silent: the link's loops (telemetry, outbox forwarder,
      commands) restart with exponential backoff (the reconnect bounds) when they raise; an
      outbox that cannot take a row (full disk, SQLite error) loses that row, logged; an event
      sink of the agent that fails is reported by its `EventTee`. While any of these lasts, the
      retained status says `degraded` with the reason; it says `online` again once they recover.
    * Events recorded before `start` (a corrupt canary state file found at start-up, replayed by
      the `EventTee`) are kept, the last `_PENDING`, and queued once the outbox is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agent import __version__
from agent.device.gpu import GpuReader
from agent.fleet import documents
from agent.fleet.command_inbox import CommandInbox, Reply
from agent.fleet.config import MqttConfig
from agent.fleet.executor import CommandExecutor, SyncNow
from agent.fleet.health import Health, supervise, why
from agent.fleet.inventory import Digests, device_facts, gpu_facts, served_versions
from agent.fleet.outbox import Kind, Outbox
from agent.fleet.rebirth import RebirthPacer
from agent.fleet.runner import CommandRunner
from agent.fleet.slo import SloEvaluator
from agent.fleet.state import FleetState
from agent.fleet.telemetry import TelemetrySampler
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.serving.dataplane import DataPlane
from agent.wire.mqtt import Message, MqttClient, MqttError, MqttSettings, Will
from agent.wire.topics import Topics

__all__ = ["SCHEMA", "FleetLink"]

logger = logging.getLogger(__name__)

SCHEMA = documents.SCHEMA
_PENDING = 64  # events recorded before start, kept for the outbox
# Events after which the retained status changes (what serves, and what does not).
_STATUS_EVENTS = frozenset(
    {
        "version_activated",
        "model_unloaded",
        "load_failed",
        "swap_failed",
        "instance_failed",
        "instance_restarted",
        "crash_loop",
    }
)


class FleetLink:
    """Connects the agent to the fleet manager (see module docstring).

    Args:
        config: The `[mqtt]` section (validated).
        dataplane: Executes load/unload/activate/rollback.
        registry: Served models and their statistics and schedulers.
        ledger: The memory budget for telemetry.
        state_path: SQLite file for the outbox, command ids and desired state.
        sync: Runs one sync cycle now; None: `sync` answers "sync is not configured".
        on_desired: Called with `MODEL=POLICY` lines after `set-desired` (and at start).
        sync_state: The sync loop's state, for telemetry.
        cache_disk: Bytes the model cache uses, for telemetry.
        gpu: A GPU reader, for telemetry (and the inventory).
        digests: The content digest of each cached (model, version), for the inventory.
        key_ids: The key ids that signed the device's trusted targets, for the inventory.
        clock: Monotonic seconds (telemetry cadence, SLO windows).
    """

    def __init__(
        self,
        config: MqttConfig,
        dataplane: DataPlane,
        registry: ModelRegistry,
        ledger: MemoryLedger | None,
        state_path: Path,
        *,
        sync: SyncNow | None = None,
        on_desired: Callable[[tuple[str, ...]], None] | None = None,
        sync_state: Callable[[], Mapping[str, Any]] | None = None,
        cache_disk: Callable[[], int] | None = None,
        gpu: GpuReader | None = None,
        digests: Digests | None = None,
        key_ids: Callable[[], list[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gpu = gpu
        self._digests = digests
        self._key_ids = key_ids
        self._facts: dict[str, Any] = {}
        self._rebirth_pacer = RebirthPacer()
        self.config = config
        self.topics = Topics(config.topic_prefix, config.device())
        self._dataplane = dataplane
        self._registry = registry
        self._state_path = state_path
        self._sync = sync
        self._on_desired = on_desired
        self._clock = clock
        self._sampler = TelemetrySampler(
            registry,
            ledger,
            started=clock(),
            cache_disk=cache_disk,
            sync_state=sync_state,
            gpu=gpu,
            rejected=dataplane.rejected_versions,
        )
        self._slo = SloEvaluator(config.slo_targets())
        self.outbox: Outbox | None = None
        self._state: FleetState | None = None
        self.client: MqttClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._commands: CommandInbox | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed: asyncio.Future[None] | None = None
        self._health = Health(self._health_changed)  # failing parts (empty: online)
        self._pending: deque[tuple[str, int | None, str, dict[str, object]]] = deque(
            maxlen=_PENDING
        )
        self._stopped = False

    async def start(self) -> None:
        """Open the stores, start connecting (in the background) and start the loops.

        Raises:
            StoreError: the state database cannot be opened.
            MqttError: the TLS files cannot be read.
        """
        self._loop = asyncio.get_running_loop()
        c = self.config
        self._facts = await asyncio.to_thread(self._read_facts)
        self.outbox = await asyncio.to_thread(
            Outbox, self._state_path, max_messages=c.outbox_max_messages
        )
        self._state = await asyncio.to_thread(FleetState, self._state_path)
        while self._pending:
            self.record(*self._pending.popleft())
        executor = CommandExecutor(
            self._dataplane,
            self._registry,
            self._state,
            status=self.status,
            rebirth=self._rebirth,
            sync=self._sync,
            on_desired=self._desired_changed,
        )
        self._commands = CommandInbox(
            CommandRunner(self._state, executor, self._envelope),
            self._state,
            self._health,
            self._envelope,
            self._send_reply,
            max_command_bytes=c.max_command_bytes,
        )
        will = Will(self.topics.status, self._status_payload("connection lost"))
        settings = MqttSettings(
            host=c.host,
            port=c.port,
            client_id=self.topics.device,
            username=c.username,
            password=c.password,
            tls_ca=c.tls_ca,
            tls_cert=c.tls_cert,
            tls_key=c.tls_key,
            protocol=c.protocol,
            keepalive_s=c.keepalive_s,
            reconnect_min_s=c.reconnect_min_ms / 1000,
            reconnect_max_s=c.reconnect_max_ms / 1000,
            will=will,
        )
        self.client = MqttClient(
            settings, on_message=self._on_message, on_connected=self._on_connected
        )
        await self.client.start()
        self._subscribed = self.client.subscribe(self.topics.commands)
        _quiet(self.client.subscribe(self.topics.rebirth_all))
        if self._on_desired is not None:
            self._on_desired(tuple(f"{m}={p}" for m, p in self._state.desired()))
        loops = (
            ("telemetry", self._telemetry_loop),
            ("outbox forwarder", self._forward_loop),
            ("command", self._commands.command_loop),
        )
        low, high = c.reconnect_min_ms / 1000, c.reconnect_max_ms / 1000
        for name, body in loops:
            part = f"{name} loop"
            task = asyncio.create_task(supervise(part, body, self._health, min_s=low, max_s=high))
            task.add_done_callback(_report_crash)
            self._tasks.append(task)

    async def wait_subscribed(self) -> None:
        """Wait until the broker has acknowledged the command subscription (bound it).

        Commands published before that are not delivered (they are not retained), so a fleet
        manager, like the tests, waits for this or for the retained `online` status.
        """
        if self._subscribed is None:
            raise RuntimeError("wait_subscribed() before start()")
        await asyncio.shield(self._subscribed)

    async def stop(self) -> None:
        """Publish `offline` (bounded wait), disconnect cleanly and close the stores."""
        self._stopped = True
        inline = self._commands.inline if self._commands is not None else set()
        for task in [*self._tasks, *inline]:
            task.cancel()
        await asyncio.gather(*self._tasks, *inline, return_exceptions=True)
        self._tasks.clear()
        if self.client is not None:
            if self.client.connected:
                goodbye = self._status_payload("stopped")
                done = self.client.publish(self.topics.status, goodbye, retain=True)
                with contextlib.suppress(TimeoutError, MqttError):
                    await asyncio.wait_for(done, 2.0)
            await self.client.stop()
        for store in (self.outbox, self._state):
            if store is not None:
                await asyncio.to_thread(store.close)
        self.outbox = self._state = None

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        """`EventSink`: queue an event for the events topic (thread-safe; never raises).

        Before `start` the event is kept for the outbox; an outbox that cannot take it (full
        disk, SQLite error) loses it, logged, and the link is `degraded` until it takes rows again.
        """
        if self.outbox is None or self._loop is None:
            if self._stopped:
                logger.warning("fleet link stopped: event %s of %s not sent", kind, model)
            else:
                self._pending.append((model, version, kind, dict(detail)))
            return
        body = documents.event_body(model, version, kind, detail)
        if self._enqueue("event", self.topics.events, body) and kind in _STATUS_EVENTS:
            self._loop.call_soon_threadsafe(self._publish_status)

    def sinks_failing(self, failing: Mapping[str, str]) -> None:
        """`SinkHealthListener`: the agent's failing event sinks make the link `degraded`."""
        parts = {f"event sink {name}": reason for name, reason in failing.items()}
        self._health.replace("event sink ", parts)

    def health(self) -> dict[str, str]:
        """What fails now (part: reason); empty when the link is `online`."""
        return self._health.snapshot()

    def status(self) -> dict[str, Any]:
        """The status document (as the retained status message and the `status` command).

        `models` lists, per loaded model, the `versions` that serve now (as the readiness
        endpoints and the index say), the ones that do not with why (`not_ready`), and those
        running without the accelerators their config asks for (`cpu_fallback`).
        """
        models = []
        for s in sorted(self._registry.served_models(), key=lambda s: s.name):
            ready = sorted(v for v, loaded in s.versions.items() if loaded.ready)
            entry: dict[str, Any] = {"name": s.name, "versions": ready}
            entry.update(self._signers(s.name, ready))
            down = {
                str(v): loaded.health.reason
                for v, loaded in sorted(s.versions.items())
                if not loaded.ready and loaded.health is not None
            }
            if down:
                entry["not_ready"] = down
            fallback = {str(v): x.fallback for v, x in sorted(s.versions.items()) if x.fallback}
            if fallback:
                entry["cpu_fallback"] = fallback
            models.append(entry)
        return documents.status_document(
            self.topics.device,
            time.time(),
            faults=self.health(),
            agent_version=__version__,
            mqtt=self.client.protocol if self.client else None,
            groups=self.config.groups,
            models=models,
            served=_or_none(self._served),
            inventory=self._facts,
            rejected=_or_none(self._dataplane.rejected_versions),
            desired=_or_none(lambda: dict(self._state.desired()) if self._state else {}),
            outbox=_or_none(lambda: self.outbox.stats().to_json() if self.outbox else None),
        )

    def _read_facts(self) -> dict[str, Any]:
        """The device facts (cheap reads; run in a worker thread)."""
        facts = device_facts()
        if self._gpu is not None:
            readings = _or_none(self._gpu.read) or []
            gpus = gpu_facts([r.to_json() for r in readings])
            if gpus:
                facts["gpu"] = gpus
        return facts

    def _served(self) -> list[dict[str, Any]]:
        served = {
            s.name: [v for v, loaded in s.versions.items() if loaded.ready]
            for s in self._registry.served_models()
        }
        digests = self._digests() if self._digests is not None else {}
        key_ids = self._key_ids() if self._key_ids is not None else []
        return served_versions(served, digests, key_ids)

    async def _rebirth(self) -> dict[str, Any]:
        """`rebirth`: read the facts again and re-publish the retained status."""
        self._facts = await asyncio.to_thread(self._read_facts)
        self._publish_status()
        return self.status()

    def _rebirth_requested(self) -> None:
        """A fleet manager asked every device for its status (paho's thread): answered on the
        loop, at most once a second and never dropped (`agent.fleet.rebirth`)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._answer_rebirth)

    def _answer_rebirth(self) -> None:
        assert self._loop is not None
        wait = self._rebirth_pacer.request(self._clock())
        if wait == 0.0:
            self._publish_status()
        elif wait is not None:
            self._loop.call_later(wait, self._rebirth_due)

    def _rebirth_due(self) -> None:
        self._rebirth_pacer.fired(self._clock())
        self._publish_status()

    def _signers(self, model: str, versions: Iterable[int]) -> dict[str, Any]:
        """`{"signers": {"VERSION": signer}}` of the served versions with a recorded signer."""
        cached = self._dataplane.versions
        if cached is None:
            return {}
        found = {}
        for version in sorted(versions):
            record = _or_none(functools.partial(cached.signature, model, version))
            if record and record.get("signer"):
                found[str(version)] = record["signer"]
        return {"signers": found} if found else {}

    def _health_changed(self) -> None:
        """Publish the status again (from any thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to publish
                loop.call_soon_threadsafe(self._publish_status)

    # --- telemetry, events and the outbox ------------------------------------------------------

    def _envelope(self, kind: str) -> dict[str, Any]:
        return documents.envelope(kind, self.topics.device, time.time())

    def _enqueue(self, kind: Kind, topic: str, body: Mapping[str, Any]) -> bool:
        outbox, loop = self.outbox, self._loop
        if outbox is None or loop is None:
            return False
        doc = {**self._envelope("event" if kind == "event" else kind), **body}
        try:
            outbox.put(kind, topic, doc)
        # Full disk, SQLite error or a bug: this row is lost, and said so.
        except Exception as exc:  # noqa: BLE001
            logger.warning("outbox: %s not queued: %s", body.get("event", kind), exc)
            self._health.fault("outbox", why(exc))
            return False
        self._health.recovered("outbox")
        loop.call_soon_threadsafe(self._wake.set)
        return True

    async def _telemetry_loop(self) -> None:
        interval = self.config.telemetry_interval_ms / 1000
        next_at = self._clock()
        while True:
            now = self._clock()
            body, samples = await asyncio.to_thread(self._sampler.sample, now)
            if self.outbox is not None:
                body["outbox"] = self.outbox.stats().to_json()
            self._enqueue("telemetry", self.topics.telemetry, body)
            for alert in self._slo.evaluate(now, samples):
                self.record(alert.model, alert.version, alert.kind, alert.figures)
            self._health.recovered("telemetry loop")
            next_at = max(next_at + interval, self._clock())
            await asyncio.sleep(next_at - self._clock())

    async def _forward_loop(self) -> None:
        assert self.client is not None
        assert self.outbox is not None
        client, outbox = self.client, self.outbox
        outbox.release()  # after a restart, the rows of the failed round are taken again
        while True:
            await client.wait_connected()
            self._wake.clear()
            rows = outbox.take(outbox.max_take)
            if not rows:
                self._health.recovered("outbox forwarder loop")
                await self._wake.wait()
                continue
            try:
                sent = [client.publish(r.topic, r.payload, qos=1) for r in rows]
            except MqttError as exc:  # paho's queue is full: let it drain
                logger.warning("outbox: %s", exc)
                outbox.release()
                await asyncio.sleep(0.5)
                continue
            await asyncio.gather(*sent)  # paho resends across reconnects; order is kept
            outbox.ack(r.seq for r in rows)
            self._health.recovered("outbox forwarder loop")

    def _desired_changed(self, lines: tuple[str, ...]) -> None:
        if self._on_desired is not None:
            self._on_desired(lines)
        self._publish_status()

    def _on_connected(self) -> None:
        self._publish_status()
        self._wake.set()

    def _publish_status(self) -> None:
        if self.client is not None and self.client.connected:
            payload = documents.encode(self.status())
            try:
                _quiet(self.client.publish(self.topics.status, payload, retain=True))
            except MqttError as exc:  # paho's queue is full; the next change publishes again
                logger.warning("status not published: %s", exc)

    def _status_payload(self, reason: str) -> bytes:
        return documents.offline_status(self.topics.device, time.time(), reason)

    # --- commands ------------------------------------------------------------------------------

    def _on_message(self, message: Message) -> None:
        if message.topic == self.topics.rebirth_all and not message.retain:
            self._rebirth_requested()
            return
        if message.topic != self.topics.commands or message.retain:
            return  # a retained command would run again on every connect
        if self._commands is None:
            return  # subscribed in start(), after the inbox exists
        reply = Reply(self.topics.reply_topic(message.response_topic), message.correlation_data)
        self._commands.receive(message.payload, reply)

    def _send_reply(self, topic: str, payload: bytes, correlation: bytes | None) -> None:
        if self.client is not None:
            _quiet(self.client.publish(topic, payload, correlation_data=correlation))


def _report_crash(task: asyncio.Task[None]) -> None:
    """A link loop must not end silently: log the bug that stopped it."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("fleet link loop %s crashed", task.get_coro(), exc_info=task.exception())


def _or_none(read: Callable[[], Any]) -> Any:
    """A status field read from a store; None when the store fails (its fault is reported)."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - a status must go out even when a store fails
        logger.debug("status field not available: %s", exc)
        return None


def _quiet(future: asyncio.Future[None]) -> None:
    """Fire and forget: retrieve the outcome so a failure is not reported as never retrieved."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
