"""The one module that touches paho-mqtt: connect, publish, subscribe, reconnect, last will.

Everything else in the agent (and the fleet CLI) uses `MqttClient`. It runs paho's network loop
in paho's own thread and hands every callback to the asyncio loop that called `start()`, so the
rest of the code never sees a paho object, a paho thread or a paho error.

Invariants:
    * MQTT 5 first; with `Protocol.AUTO` a broker that answers "unsupported protocol version"
      gets a new client speaking 3.1.1 (response topic and correlation data are then dropped).
    * Reconnection is automatic, with exponential backoff between `reconnect_min_s` and
      `reconnect_max_s`; subscriptions are renewed on every connect.
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

from agent.wire.mqtt_version import Protocol as Protocol  # noqa: PLC0414 - re-exported

logger = logging.getLogger(__name__)

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
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        on_message: Callable[[Message], None] | None = None,
        on_connected: Callable[[], None] | None = None,
        on_disconnected: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_message = on_message
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: paho.Client | None = None
        self._protocol = Protocol.V311 if settings.protocol is Protocol.V311 else Protocol.V5
        self._subscriptions: dict[str, int] = {}
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._suback: dict[int, asyncio.Future[None]] = {}
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
        await asyncio.to_thread(self._start_client)

    async def stop(self) -> None:
        """Disconnect cleanly (no last will), stop paho's thread, fail pending publishes."""
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(_stop_client, client)
        self._connected.clear()
        for future in [*self._pending.values(), *self._suback.values(), *self._waiting.values()]:
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

    def _send_subscribe(
        self, client: paho.Client, topic: str, qos: int, future: asyncio.Future[None] | None
    ) -> None:
        rc, mid = client.subscribe(topic, qos)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            logger.warning("MQTT subscribe %s failed: %s", topic, paho.error_string(rc))
        elif future is not None:
            self._suback[mid] = future

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

    # --- paho's thread ---------------------------------------------------------------------

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
        client.enable_logger(logger)
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
        client.connect_async(
            s.host,
            s.port,
            s.keepalive_s,
            clean_start=not s.persistent_session if v5 else paho.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props,
        )
        self._client = client  # before the network thread starts: callbacks check it
        client.loop_start()

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
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
        self._call(self._failed, client, "connection failed", False)

    def _paho_disconnect(
        self, client: paho.Client, _ud: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        self._call(self._failed, client, f"disconnected: {reason}", False, True)

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
        self._call(_resolve, self._suback, mid)

    # --- the asyncio loop --------------------------------------------------------------------

    def _up(self, client: paho.Client) -> None:
        if client is not self._client:
            return
        logger.info("MQTT connected to %s:%d (MQTT %s)", *self._where(), self.protocol)
        self._ever_up = True
        self._connected.set()
        for topic, qos in self._subscriptions.items():
            self._send_subscribe(client, topic, qos, self._waiting.pop(topic, None))
        if self._on_connected is not None:
            self._on_connected()

    def _failed(
        self, client: paho.Client, reason: str, unsupported: bool, closed: bool = False
    ) -> None:
        if client is not self._client:
            return
        self.failures += 1
        was_up = self.connected
        if closed and not was_up and not self._ever_up:
            # Some 3.1.1-only brokers (RabbitMQ's MQTT plugin before 3.13) close the socket on
            # an MQTT 5 CONNECT instead of refusing it: twice in a row counts as a refusal.
            self._closed_before_connack += 1
            unsupported = unsupported or self._closed_before_connack >= _CLOSED_MEANS_OLD
        self._connected.clear()
        if was_up:
            logger.warning("MQTT connection to %s:%d lost: %s", *self._where(), reason)
        else:
            logger.info("MQTT connect to %s:%d failed: %s", *self._where(), reason)
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
        await asyncio.to_thread(_stop_client, old)
        await asyncio.to_thread(self._start_client)

    def _where(self) -> tuple[str, int]:
        return self.settings.host, self.settings.port


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
