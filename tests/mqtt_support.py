"""Test support for the fleet link: a real Mosquitto broker, a PKI, an agent on its own loop."""

from __future__ import annotations

import asyncio
import datetime
import functools
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.fleet.config import MqttConfig, validate_mqtt
from agent.fleet.link import FleetLink
from agent.models.cache_control import CachedVersions, CacheEvents
from agent.models.control import ModelManager
from agent.models.events import EventTee, LogEvents
from agent.runtime.daemon import RunningAgent, start_agent
from agent.runtime.demo import mlp_model
from agent.runtime.signed_sync import provenance_reader
from agent.wire.mqtt import Message, MqttSettings, Protocol, random_client_id
from model_cache import ModelCache
from tests.models import M_CONFIG, write_model
from tests.support import free_port, wait_until

T = TypeVar("T")

#: Starts a FleetLink on the served agent's loop (the `start_link` fixture).
LinkFactory = Callable[..., FleetLink]


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and a rogue client."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    ip: str | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}

    def write(name: str, data: bytes) -> Path:
        files[name] = folder / name
        files[name].write_bytes(data)
        return files[name]

    ca_key, rogue_ca_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    write(
        "ca.pem", _cert("test-ca", ca_key, None, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    for name, issuer in (
        ("server", ("test-ca", ca_key)),
        ("client", ("test-ca", ca_key)),
        ("rogue", ("rogue-ca", rogue_ca_key)),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, issuer, ip="127.0.0.1" if name == "server" else None)
        write(f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
        write(f"{name}.key", _key_pem(key))
    return Pki(
        files["ca.pem"], files["server.pem"], files["server.key"], files["client.pem"],
        files["client.key"], files["rogue.pem"], files["rogue.key"],
    )  # fmt: skip


class Broker:
    """A Mosquitto process on free loopback ports; stopped (and restarted) by its pid."""

    def __init__(self, folder: Path, *, pki: Pki | None = None, persistence: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.tls_port = free_port() if pki else None
        self.pki = pki
        self.persistence = persistence
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = folder / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            f"persistence {'true' if persistence else 'false'}",
            f"persistence_location {folder}/",
            "log_dest stderr",
            # Run as root, mosquitto would switch to its own user, which cannot read tmp_path.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
        ]
        if pki is not None:
            lines += [
                f"listener {self.tls_port} 127.0.0.1",
                f"cafile {pki.ca}",
                f"certfile {pki.server_cert}",
                f"keyfile {pki.server_key}",
                "require_certificate true",
            ]
        folder.mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        log = (self.folder / "broker.log").open("ab")
        self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stderr=log, stdout=log)
        log.close()
        for port in filter(None, (self.port, self.tls_port)):
            wait_until(functools.partial(_accepts, port), f"mosquitto on port {port}", timeout_s=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None

    def settings(self, **kw: Any) -> MqttSettings:
        base: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "client_id": random_client_id("test"),
            "persistent_session": False,
            "reconnect_min_s": 0.1,
            "reconnect_max_s": 0.5,
            "protocol": Protocol.AUTO,
        }
        return MqttSettings(**{**base, **kw})


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class AgentThread:
    """A started agent on an event loop in a background thread, as the daemon would run it."""

    def __init__(
        self, agent: RunningAgent, loop: asyncio.AbstractEventLoop, events: EventTee
    ) -> None:
        self.agent = agent
        self.loop = loop
        self.events = events

    def run(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout)


@contextmanager
def agent_thread(config: AgentConfig) -> Iterator[AgentThread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    agent = asyncio.run_coroutine_threadsafe(start_agent(config), loop).result(timeout=120)
    # The wiring the daemon will do: model events go to the cache and to the fleet links.
    events = EventTee(CacheEvents(agent.model_cache) if agent.model_cache else LogEvents())
    manager = ModelManager(agent.registry, events)
    agent.dataplane.manager = manager
    agent.dataplane.canary.events = events
    if agent.model_cache is not None:
        agent.dataplane.versions = CachedVersions(
            agent.model_cache, manager, provenance=provenance_reader(config, agent.model_cache)
        )
    try:
        yield AgentThread(agent, loop, events)
    finally:
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def mqtt_config(broker: Broker, **overrides: Any) -> MqttConfig:
    """The fleet link's config for device dev1 on `broker`, fast telemetry and reconnects."""
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": broker.port,
        "device_id": "dev1",
        "telemetry_interval_ms": 200,
        "reconnect_min_ms": 100,
        "reconnect_max_ms": 500,
    }
    config = MqttConfig(**{**base, **overrides})
    validate_mqtt(config)
    return config


async def first(stream: Any, match: Any, limit: float = 20.0) -> dict[str, Any]:
    """The first streamed message (as JSON) that `match` accepts."""
    async with asyncio.timeout(limit):
        async for message in stream:
            doc = json.loads(message.payload)
            if match(message, doc):
                return dict(doc)
    raise AssertionError("stream ended")


def is_kind(kind: str, **fields: Any) -> Any:
    """A `first` matcher: messages of `kind` whose fields equal `fields`."""

    def match(_message: Message, doc: Mapping[str, Any]) -> bool:
        return doc.get("kind") == kind and all(doc.get(k) == v for k, v in fields.items())

    return match


def build_cache(root: Path) -> Path:
    """A cache holding version 1 (active) and version 2 (ready) of model m."""
    for version in (1, 2):
        write_model(root / f"src{version}", "m", mlp_model(seed=version), M_CONFIG, (version,))
    cache = ModelCache(root / "cache")
    try:
        cache.install("m", 1, root / "src1/m")
        cache.activate("m", 1)
        cache.install("m", 2, root / "src2/m")
    finally:
        cache.close()
    return root / "cache"


def agent_config(cache_dir: Path) -> AgentConfig:
    return AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            control_mode=ModelControlMode.EXPLICIT, load_models=("*",), intra_op_threads=1
        ),
        cache=CacheConfig(dir=cache_dir),
    )
