"""The one module (with its network loop, `agent.wire.mqtt_loop`) that touches paho-mqtt:
connect, publish, subscribe, reconnect, fail over, last will.

Everything else in the agent (and the fleet CLI) uses `MqttClient`. It runs paho's network loop
in paho's own thread and hands every callback to the asyncio loop that called `start()`, so the
rest of the code never sees a paho object, a paho thread or a paho error. Given a
`LoopNetwork`, it runs paho's network side on the asyncio loop instead, so that one process can
hold thousands of connections (the fleet simulator); everything else is the same.

Invariants:
    * MQTT 5 first; with `Protocol.AUTO` a broker that answers "unsupported protocol version"
      gets a new client speaking 3.1.1 (response topic and correlation data are then dropped).
    * Reconnection is automatic, with exponential backoff between `reconnect_min_s` and
      `reconnect_max_s`; subscriptions are renewed on every connect. With `brokers` (the other
      nodes of a cluster), each failed attempt or lost connection moves on to the next one.
    * `publish` returns a future that completes when the broker acknowledged (QoS 1) or the
      packet was written (QoS 0). Messages in flight when the connection drops are sent again by
      paho on reconnect; the futures stay pending until then, and fail only on `stop()`.
    * `stop()` disconnects cleanly, so the broker does *not* publish the last will; a crash or
      a lost connection does.
    * Library errors become `MqttError`; callbacks given to this class run on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.wire.mqtt_loop import LoopNetwork
from agent.wire.mqtt_version import Protocol as Protocol  # noqa: PLC0414 - re-exported

logger = logging.getLogger(__name__)


class _LoopNoise(logging.Filter):
    """paho's threaded loop runs once more after the clean disconnect it just wrote, and logs
    "Client is not connected" as an error each time (a race with `loop_stop`): not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Client is not connected")


_paho_logger = logging.getLogger(f"{__name__}.paho")
_paho_logger.addFilter(_LoopNoise())

_CLOSED_MEANS_OLD = 2  # MQTT 5 CONNECTs closed without CONNACK before falling back (auto)
_UNSUPPORTED_PROTOCOL = 132  # CONNACK reason code (3.1.1 brokers answer rc 1; paho maps it here)
_SESSION_EXPIRY_S = 24 * 3600
_MAX_PACKET_BYTES = 1 << 20  # asked of the broker: larger packets to us are dropped there


class MqttError(Exception):
    """A transport failure: not connected, publish refused, or the client was stopped."""


@dataclass(frozen=True, slots=True)
class Will:
    """The last will: published by the broker when the client vanishes without a goodbye."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """How to reach the broker."""

    host: str
    port: int
    client_id: str
    username: str = ""
    password: str = ""
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    protocol: Protocol = Protocol.AUTO
    keepalive_s: int = 30
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 60.0
    persistent_session: bool = True  # the broker keeps our subscriptions and QoS 1 messages
    will: Will | None = None
    max_inflight: int = 32
    brokers: tuple[tuple[str, int], ...] = ()  # (host, port) to fail over to, after host:port

    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every broker address, in the order tried: host:port first, then `brokers`."""
        first = (self.host, self.port)
        return (first, *(b for b in self.brokers if b != first))


@dataclass(frozen=True, slots=True)
class Message:
    """An inbound message (MQTT 5 properties are None under 3.1.1)."""

    topic: str
    payload: bytes
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None

    def json_object(self) -> dict[str, Any] | None:
        """The payload as a JSON object; None when it is not JSON or not an object."""
        try:
            doc = json.loads(self.payload)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
            return None
        return doc if isinstance(doc, dict) else None


class MqttClient:
    """An asyncio-friendly MQTT client (see module docstring).

    Args:
        settings: Broker, identity, TLS, protocol and will.
        on_message: Called on the loop for each inbound message.
        on_connected: Called on the loop after each successful connect (subscriptions renewed).
        on_disconnected: Called on the loop with a reason after a lost connection or a failed
            attempt (TLS refused, broker down).
        network: Run paho's network side on the event loop, shared with other clients (None:
            in a thread of its own).
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        on_message: Callable[[Message], None] | None = None,
        on_connected: Callable[[], None] | None = None,
        on_disconnected: Callable[[str], None] | None = None,
        network: LoopNetwork | None = None,
    ) -> None:
        self.settings = settings
        self._network = network
        self._addresses = settings.addresses()
        self._at = 0  # which of the addresses the next attempt goes to
        self._clean_start: paho.CleanStartOption = paho.MQTT_CLEAN_START_FIRST_ONLY
        self._connect_props: Properties | None = None
        self._on_message = on_message
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: paho.Client | None = None
        self._protocol = Protocol.V311 if settings.protocol is Protocol.V311 else Protocol.V5
        self._subscriptions: dict[str, int] = {}
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._suback: dict[int, tuple[str, asyncio.Future[None]]] = {}  # mid -> topic, future
        self._waiting: dict[str, asyncio.Future[None]] = {}  # subscribed while disconnected
        self._connected = asyncio.Event()
        self.failures = 0  # failed or lost connections since start
        self._ever_up = False
        self._closed_before_connack = 0  # MQTT 5 CONNECTs the broker answered by closing

    @property
    def protocol(self) -> str:
        """The MQTT version in use: "5" or "3.1.1"."""
        return self._protocol.value

    @property
    def connected(self) -> bool:
        """Whether the broker accepted the connection and it is up."""
        return self._connected.is_set()

    async def wait_connected(self) -> None:
        """Wait until connected (bound it with `asyncio.timeout`)."""
        await self._connected.wait()

    async def start(self) -> None:
        """Start connecting in the background; returns at once (the broker may be away)."""
        self._loop = asyncio.get_running_loop()
        if self._network is not None:
            self._start_client()
        else:
            await asyncio.to_thread(self._start_client)

    @property
    def broker(self) -> tuple[str, int]:
        """The broker address connected to now, or tried next."""
        return self._addresses[self._at]

    async def stop(self) -> None:
        """Disconnect cleanly (no last will), stop paho's thread, fail pending publishes."""
        client, self._client = self._client, None
        if client is not None:
            await self._stop_client(client)
        self._connected.clear()
        subacks = [future for _topic, future in self._suback.values()]
        for future in [*self._pending.values(), *subacks, *self._waiting.values()]:
            if not future.done():
                future.set_exception(MqttError("MQTT client stopped"))
        self._pending.clear()
        self._suback.clear()
        self._waiting.clear()

    def subscribe(self, topic: str, qos: int = 1) -> asyncio.Future[None]:
        """Subscribe now and again on every reconnect; the future completes at the first SUBACK.

        Raises:
            MqttError: the client is not started.
        """
        if self._client is None:
            raise MqttError("MQTT client not started")
        self._subscriptions[topic] = qos
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.connected:
            self._send_subscribe(self._client, topic, qos, future)
        else:
            self._waiting[topic] = future
        return future

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving `topic` (now, and it is not renewed on reconnects).

        Raises:
            MqttError: the client is not started.
        """
        if self._client is None:
            raise MqttError("MQTT client not started")
        self._subscriptions.pop(topic, None)
        waiting = self._waiting.pop(topic, None)
        if waiting is not None and not waiting.done():
            waiting.set_exception(MqttError(f"unsubscribed from {topic} before it was subscribed"))
            waiting.exception()  # retrieved: nobody may be waiting for it
        if self.connected:
            rc, _mid = self._client.unsubscribe(topic)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                logger.warning("MQTT unsubscribe %s failed: %s", topic, paho.error_string(rc))

    def _send_subscribe(
        self, client: paho.Client, topic: str, qos: int, future: asyncio.Future[None] | None
    ) -> None:
        rc, mid = client.subscribe(topic, qos)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            logger.warning("MQTT subscribe %s failed: %s", topic, paho.error_string(rc))
        elif future is not None:
            self._suback[mid] = (topic, future)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> asyncio.Future[None]:
        """Publish a message; the future completes at PUBACK (QoS 1) or once written (QoS 0).

        While disconnected, paho keeps the message and sends it after reconnecting.

        Raises:
            MqttError: the client is not started, or paho refused the message (queue full).
        """
        if self._client is None:
            raise MqttError("MQTT client not started")
        props: Properties | None = None
        if self._protocol is Protocol.V5 and (response_topic or correlation_data):
            props = _properties(PacketTypes.PUBLISH)
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation_data:
                props.CorrelationData = correlation_data
        info = self._client.publish(topic, payload, qos, retain, props)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise MqttError(f"publish {topic}: {paho.error_string(info.rc)}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # on_publish arrives through call_soon_threadsafe, so it cannot run before this line.
        self._pending[info.mid] = future
        return future

    # --- paho's thread (or, with a `LoopNetwork`, the loop) ---------------------------------

    async def _stop_client(self, client: paho.Client) -> None:
        if self._network is not None:
            await self._network.detach(client)
        else:
            await asyncio.to_thread(_stop_client, client)

    def _start_client(self) -> None:
        s = self.settings
        v5 = self._protocol is Protocol.V5
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if v5 else not s.persistent_session,
            reconnect_on_failure=True,
        )
        client.enable_logger(_paho_logger)
        if s.username:
            client.username_pw_set(s.username, s.password or None)
        if s.tls_ca is not None:
            try:
                client.tls_set(
                    ca_certs=str(s.tls_ca),
                    certfile=str(s.tls_cert) if s.tls_cert else None,
                    keyfile=str(s.tls_key) if s.tls_key else None,
                    cert_reqs=ssl.CERT_REQUIRED,
                    tls_version=ssl.PROTOCOL_TLS_CLIENT,
                )
            except (OSError, ValueError) as exc:
                raise MqttError(f"TLS files: {exc}") from None
        if s.will is not None:
            client.will_set(s.will.topic, s.will.payload, s.will.qos, s.will.retain)
        # paho annotates whole seconds but computes with whatever it is given.
        client.reconnect_delay_set(s.reconnect_min_s, s.reconnect_max_s)  # type: ignore[arg-type]
        client.max_inflight_messages_set(s.max_inflight)
        client.on_connect = self._paho_connect
        client.on_connect_fail = self._paho_connect_fail
        client.on_disconnect = self._paho_disconnect
        client.on_message = self._paho_message
        client.on_publish = self._paho_publish
        client.on_subscribe = self._paho_subscribe
        props: Properties | None = None
        if v5:
            props = _properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = _SESSION_EXPIRY_S if s.persistent_session else 0
            props.MaximumPacketSize = _MAX_PACKET_BYTES
        self._clean_start = not s.persistent_session if v5 else paho.MQTT_CLEAN_START_FIRST_ONLY
        self._connect_props = props
        if self._network is not None:
            client.connect_timeout = self._network.connect_timeout_s  # connects block the loop
        self._connect_to(client)
        self._client = client  # before the network thread starts: callbacks check it
        if self._network is not None:
            self._network.attach(
                client,
                min_s=s.reconnect_min_s,
                max_s=s.reconnect_max_s,
                on_connect_fail=lambda: self._paho_connect_fail(client, None),
            )
        else:
            client.loop_start()

    def _connect_to(self, client: paho.Client) -> None:
        """Aim the next attempt at the current address (paho's or the loop's thread)."""
        host, port = self._addresses[self._at]
        client.connect_async(
            host,
            port,
            self.settings.keepalive_s,
            clean_start=self._clean_start,
            properties=self._connect_props,
        )

    def _fail_over(self, client: paho.Client) -> None:
        """After a failure, the next attempt goes to the next broker (with `brokers` only)."""
        if len(self._addresses) > 1 and client is self._client:
            self._at = (self._at + 1) % len(self._addresses)
            self._connect_to(client)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if self._network is not None:
            loop.call_soon(fn, *args)  # already on the loop: no wake-up needed
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _paho_connect(
        self, client: paho.Client, _ud: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            value = int(reason.value)
            self._call(self._failed, client, f"refused: {reason}", value == _UNSUPPORTED_PROTOCOL)
            return
        self._call(self._up, client)

    def _paho_connect_fail(self, client: paho.Client, _ud: Any) -> None:
        where = self._where()
        self._fail_over(client)
        self._call(self._failed, client, "connection failed", False, False, where)

    def _paho_disconnect(
        self, client: paho.Client, _ud: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        where = self._where()
        self._fail_over(client)
        self._call(self._failed, client, f"disconnected: {reason}", False, True, where)

    def _paho_message(self, _client: paho.Client, _ud: Any, msg: paho.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        response = getattr(props, "ResponseTopic", None) if props is not None else None
        corr = getattr(props, "CorrelationData", None) if props is not None else None
        message = Message(msg.topic, bytes(msg.payload), bool(msg.retain), response, corr)
        if self._on_message is not None:
            self._call(self._on_message, message)

    def _paho_publish(self, _c: paho.Client, _ud: Any, mid: int, _rc: Any, _p: Any) -> None:
        self._call(_resolve, self._pending, mid)

    def _paho_subscribe(self, _c: paho.Client, _ud: Any, mid: int, _rc: Any, _p: Any) -> None:
        self._call(self._subscribed, mid)

    # --- the asyncio loop --------------------------------------------------------------------

    def _subscribed(self, mid: int) -> None:
        _topic, future = self._suback.pop(mid, ("", None))
        if future is not None and not future.done():
            future.set_result(None)

    def _up(self, client: paho.Client) -> None:
        if client is not self._client:
            return
        logger.info("MQTT connected to %s:%d (MQTT %s)", *self._where(), self.protocol)
        if self._network is not None:
            self._network.connected(client)
        self._ever_up = True
        self._connected.set()
        for topic, qos in self._subscriptions.items():
            self._send_subscribe(client, topic, qos, self._waiting.pop(topic, None))
        if self._on_connected is not None:
            self._on_connected()

    def _failed(
        self,
        client: paho.Client,
        reason: str,
        unsupported: bool,
        closed: bool = False,
        where: tuple[str, int] | None = None,
    ) -> None:
        if client is not self._client:
            return
        host, port = where or self._where()
        self.failures += 1
        was_up = self.connected
        if closed and not was_up and not self._ever_up:
            # Some 3.1.1-only brokers (RabbitMQ's MQTT plugin before 3.13) close the socket on
            # an MQTT 5 CONNECT instead of refusing it: twice in a row counts as a refusal.
            self._closed_before_connack += 1
            unsupported = unsupported or self._closed_before_connack >= _CLOSED_MEANS_OLD
        self._connected.clear()
        # SUBACKs that will not come: the subscriptions go again at the next connect.
        for topic, future in self._suback.values():
            if topic in self._subscriptions and not future.done():
                self._waiting.setdefault(topic, future)
        self._suback.clear()
        if was_up:
            logger.warning("MQTT connection to %s:%d lost: %s", host, port, reason)
        else:
            logger.info("MQTT connect to %s:%d failed: %s", host, port, reason)
        if (
            unsupported
            and self.settings.protocol is Protocol.AUTO
            and self._protocol is Protocol.V5
        ):
            logger.warning("broker does not speak MQTT 5: falling back to 3.1.1")
            self._protocol = Protocol.V311
            asyncio.get_running_loop().create_task(self._restart(client))
        if self._on_disconnected is not None:
            self._on_disconnected(reason)

    async def _restart(self, old: paho.Client) -> None:
        self._client = None
        await self._stop_client(old)
        if self._network is not None:
            self._start_client()
        else:
            await asyncio.to_thread(self._start_client)

    def _where(self) -> tuple[str, int]:
        return self._addresses[self._at]


def _resolve(futures: dict[int, asyncio.Future[None]], mid: int) -> None:
    future = futures.pop(mid, None)
    if future is not None and not future.done():
        future.set_result(None)


def _stop_client(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


def _properties(packet_type: int) -> Properties:
    return Properties(packet_type)  # type: ignore[no-untyped-call]


def random_client_id(prefix: str) -> str:
    """A unique client id for short-lived tools (the fleet CLI)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
