"""The `[mqtt]` config section: how the agent reaches the fleet manager's broker.

    [mqtt]
    host = "broker.example"       # "" (the default): no fleet link
    port = 8883
    device_id = "jetson-17"       # "" : the host name; also the MQTT client id
    topic_prefix = "edge"         # topics are {prefix}/{device}/status|telemetry|events|...
    tls_ca = "ca.pem"             # set: TLS; with tls_cert and tls_key: mutual TLS
    tls_cert = "device.pem"
    tls_key = "device.key"
    telemetry_interval_ms = 10000
    slo = ["resnet:p95_ms=50,error_rate=0.001", "*:p99_ms=200"]
    groups = ["site-a", "orin-nx"]  # rollouts target devices by group

Only the types `agent.config.schema` can read from TOML are used (bool, int, str, tuple[str, ...],
Path | None, an enum for a closed choice: `protocol`); fractional values live in the `slo`
strings, which `agent.fleet.slo` parses.
`validate_mqtt` checks everything at start-up, so bad settings fail at boot.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentConfigError
from agent.fleet.slo import SloTarget, parse_slo_targets
from agent.wire.mqtt_version import Protocol

_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_GROUP = _DEVICE
_PREFIX = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """Broker connection, topics, telemetry cadence, bounds and SLO targets."""

    host: str = ""  # "": the fleet link is off
    port: int = 1883
    device_id: str = ""  # "": the host name
    username: str = ""
    password: str = ""
    tls_ca: Path | None = None  # set: TLS, verifying the broker against this CA
    tls_cert: Path | None = None  # with tls_key: mutual TLS
    tls_key: Path | None = None
    protocol: Protocol = Protocol.AUTO  # auto: MQTT 5, falling back to 3.1.1 | "5" | "3.1.1"
    keepalive_s: int = 30
    reconnect_min_ms: int = 500
    reconnect_max_ms: int = 60_000
    topic_prefix: str = "edge"
    telemetry_interval_ms: int = 10_000
    max_command_bytes: int = 64 * 1024  # larger commands get an error response
    outbox_max_messages: int = 10_000  # store and forward while the broker is away
    state_dir: Path | None = None  # fleet.sqlite lives here; None: the daemon chooses
    slo: tuple[str, ...] = ()  # "MODEL:p95_ms=50,error_rate=0.001" ("*": every model)
    groups: tuple[str, ...] = ()  # e.g. site, hardware class: what fleet rollouts target

    def __post_init__(self) -> None:  # a spelling given in code becomes its member
        if isinstance(self.protocol, Protocol):
            return
        try:
            object.__setattr__(self, "protocol", Protocol(self.protocol))
        except ValueError:
            allowed = ", ".join(p.value for p in Protocol)
            raise AgentConfigError(
                f"config key 'mqtt.protocol' must be one of {allowed}, got {self.protocol!r}"
            ) from None

    @property
    def enabled(self) -> bool:
        """Whether a broker is configured."""
        return bool(self.host)

    def device(self) -> str:
        """The device id: `device_id`, or the host name when it is empty."""
        return self.device_id or _safe_hostname()

    def slo_targets(self) -> tuple[SloTarget, ...]:
        """The parsed `slo` entries (validated by `validate_mqtt`)."""
        return parse_slo_targets(self.slo)


def validate_mqtt(config: MqttConfig) -> None:
    """Check an `[mqtt]` section once at start-up.

    Raises:
        AgentConfigError: a value out of range, a device id or prefix that is not a plain
            topic level, a client key without its certificate, or a bad SLO entry.
    """
    if not config.enabled:
        return
    if not 1 <= config.port <= 65535:
        raise AgentConfigError(f"mqtt.port must be 1..65535, got {config.port}")
    if not _DEVICE.match(config.device()):
        raise AgentConfigError(
            f"mqtt.device_id {config.device()!r} must be 1-64 of A-Z a-z 0-9 . _ - "
            "(it is one topic level and the client id)"
        )
    if not _PREFIX.match(config.topic_prefix):
        raise AgentConfigError(
            f"mqtt.topic_prefix {config.topic_prefix!r} must be topic levels of A-Z a-z 0-9 . _ -"
        )
    if (config.tls_cert is None) != (config.tls_key is None):
        raise AgentConfigError("mqtt.tls_cert and mqtt.tls_key go together (mutual TLS)")
    if config.tls_cert is not None and config.tls_ca is None:
        raise AgentConfigError("mqtt.tls_cert needs mqtt.tls_ca (the broker's CA)")
    for key in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(config, key)
        if path is not None and not Path(path).is_file():
            raise AgentConfigError(f"mqtt.{key}: {path} is not a file")
    if not 5 <= config.keepalive_s <= 3600:
        raise AgentConfigError("mqtt.keepalive_s must be 5..3600")
    if not 10 <= config.reconnect_min_ms <= config.reconnect_max_ms:
        raise AgentConfigError("mqtt.reconnect_min_ms must be >= 10 and <= reconnect_max_ms")
    if config.telemetry_interval_ms < 50:
        raise AgentConfigError("mqtt.telemetry_interval_ms must be >= 50")
    if not 256 <= config.max_command_bytes <= 16 * 1024 * 1024:
        raise AgentConfigError("mqtt.max_command_bytes must be 256..16 MiB")
    if config.outbox_max_messages < 8:
        raise AgentConfigError("mqtt.outbox_max_messages must be >= 8")
    if len(config.groups) > 32 or not all(_GROUP.match(g) for g in config.groups):
        raise AgentConfigError(
            "mqtt.groups must be at most 32 names of 1-64 of A-Z a-z 0-9 . _ - (e.g. site-a)"
        )
    try:
        parse_slo_targets(config.slo)
    except ValueError as exc:
        raise AgentConfigError(f"mqtt.slo: {exc}") from None


def _safe_hostname() -> str:
    """The host name cut to its first label, with characters a topic level cannot hold removed."""
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64] or "edge-device"
