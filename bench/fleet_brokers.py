"""The brokers of the fleet benchmarks, set up as an operator would for 10,000 devices.

`Mosquitto` writes a configuration with the limits a fleet of that size needs (docs/mqtt.md,
"Sizing"), raises the process's open-file limit, and listens on a free loopback port:

    max_connections -1            no cap on connections (the default is none either; said aloud)
    max_queued_messages 100000    per client: a manager subscribing to every retained status
                                  gets one per device at once; the default, 1000, drops the
                                  rest (3,000 devices: `fleet inventory` saw 1,020)
    max_inflight_messages 1000    QoS 1 messages in flight to one client (default 20)
    set_tcp_nodelay true          commands and answers are small: no Nagle delay
    sys_interval 1                $SYS counters every second (the benchmark's messages/s)

`RabbitCluster` runs Debian's RabbitMQ as an `n`-node cluster on this machine: one epmd on a
free port, each node with its own name, distribution port, MQTT port, data and log folders and
the same Erlang cookie, formed by classic-config peer discovery; MQTT sessions live in quorum
queues (`mqtt.durable_queue_type = quorum`), replicated on every node, so a device's session
outlives the node it was connected to. `stop_node(i)` stops one node (SIGTERM to its own
process group, which it leads: only what that node started).

Every process is started here and ended by its pid, never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pwd
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from agent.wire.mqtt import MqttClient, MqttSettings, Protocol, random_client_id

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # Debian's, without su


class BrokerError(RuntimeError):
    """A broker did not start (the message says which and where its log is)."""


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether something listens on the loopback port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def mqtt_answers(port: int, protocol: Protocol = Protocol.V311) -> bool:
    """Whether a broker on the loopback port accepts an MQTT session (a CONNACK within 5 s)."""

    async def probe() -> bool:
        settings = MqttSettings(
            "127.0.0.1",
            port,
            random_client_id("probe"),
            protocol=protocol,
            persistent_session=False,
            reconnect_max_s=1.0,
        )
        client = MqttClient(settings)
        await client.start()
        try:
            async with asyncio.timeout(5):
                await client.wait_connected()
            return True
        except TimeoutError:
            return False
        finally:
            await client.stop()

    return asyncio.run(probe())


def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Poll `check` until it holds.

    Raises:
        BrokerError: not within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise BrokerError(f"{what} not ready within {timeout_s:g} s")
        time.sleep(0.1)


def open_files(wanted: int) -> Callable[[], None]:
    """A `preexec_fn` raising the child's open-file limit to `wanted` (or as far as allowed)."""

    def raise_limit() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft >= wanted:
            return
        try:  # root (or CAP_SYS_RESOURCE) may raise the hard limit too
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(wanted, hard)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    return raise_limit


def stop_pid(proc: subprocess.Popen[bytes], grace_s: float = 20.0, *, group: bool = False) -> None:
    """SIGTERM the child (its process group, which it leads, with `group`), wait, SIGKILL."""
    if proc.poll() is not None:
        return

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)  # the child called setsid: its group id is its pid
            else:
                proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=10)


class Mosquitto:
    """Mosquitto with a fleet's limits on a free loopback port (see module docstring)."""

    def __init__(self, folder: Path, *, devices: int, defaults: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.devices = devices
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = folder / "mosquitto.conf"
        self.log = folder / "mosquitto.log"
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence false",
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "sys_interval 1",
            # Run as root, mosquitto would switch to its own user, which cannot write here.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
        ]
        if not defaults:
            lines += [
                "max_connections -1",
                f"max_queued_messages {max(100_000, 4 * devices)}",
                "max_inflight_messages 1000",
                "set_tcp_nodelay true",
            ]
        folder.mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    @property
    def brokers(self) -> tuple[tuple[str, int], ...]:
        """Its address, as the simulator takes a list."""
        return (("127.0.0.1", self.port),)

    def start(self) -> None:
        """Start it and wait until it listens."""
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        with (self.folder / "stderr.log").open("ab") as err:
            self.proc = subprocess.Popen(
                [binary, "-c", str(self.conf)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=open_files(2 * self.devices + 1024),  # noqa: PLW1509 - no threads yet
            )
        wait_for(lambda: accepts(self.port), f"mosquitto on {self.port} ({self.log})", 15)

    def stop(self) -> None:
        """Stop it by its pid."""
        if self.proc is not None:
            stop_pid(self.proc)
        self.proc = None

    def pids(self) -> list[int]:
        """The broker's process ids (for CPU and memory figures)."""
        return [self.proc.pid] if self.proc is not None else []

    def settings(self, **kw: object) -> MqttSettings:
        """Client settings for this broker."""
        base: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "client_id": random_client_id("bench"),
            "persistent_session": False,
        }
        return MqttSettings(**{**base, **kw})  # type: ignore[arg-type]


def rabbitmq_missing() -> str | None:
    """None when RabbitMQ's server can be started here, else why not."""
    if RABBITMQ_SERVER.exists() and shutil.which("epmd"):
        return None
    return "rabbitmq-server is not installed (sudo apt-get install rabbitmq-server)"


class RabbitCluster:
    """RabbitMQ's MQTT plugin on `nodes` clustered nodes on this machine (module docstring)."""

    def __init__(self, folder: Path, *, nodes: int = 3) -> None:
        self.folder = folder
        self.tag = secrets.token_hex(3)
        self.names = [f"fleet{i}-{self.tag}@localhost" for i in range(nodes)]
        self.ports = [free_port() for _ in range(nodes)]
        self.epmd_port = free_port()
        self.cookie = secrets.token_hex(16)
        self.epmd: subprocess.Popen[bytes] | None = None
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes

    @property
    def brokers(self) -> tuple[tuple[str, int], ...]:
        """Every node's MQTT address."""
        return tuple(("127.0.0.1", p) for p in self.ports)

    def _node_env(self, i: int) -> dict[str, str]:
        home = self.folder / f"node{i}"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)
        peers = "\n".join(
            f"cluster_formation.classic_config.nodes.{k + 1} = {name}"
            for k, name in enumerate(self.names)
        )
        (home / "rabbitmq.conf").write_text(
            "listeners.tcp = none\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.ports[i]}\n"
            "mqtt.allow_anonymous = true\n"
            "mqtt.durable_queue_type = quorum\n"
            "loopback_users = none\n"
            "cluster_formation.peer_discovery_backend = classic_config\n"
            f"{peers}\n"
            "cluster_formation.randomized_startup_delay_range.min = 0\n"
            "cluster_formation.randomized_startup_delay_range.max = 1\n"
        )
        (home / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        return {
            **os.environ,
            "HOME": str(home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.names[i],
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_LOGS": "-",
        }

    def start(self, timeout_s: float = 240.0) -> None:
        """Start epmd and every node; wait until each node's MQTT listener answers."""
        self.folder.mkdir(parents=True, exist_ok=True)
        epmd = shutil.which("epmd") or "epmd"
        with (self.folder / "epmd.log").open("ab") as log:
            self.epmd = subprocess.Popen(
                [epmd, "-port", str(self.epmd_port)], stdout=log, stderr=log
            )
        try:
            for i in range(len(self.names)):
                self.start_node(i)
            for i, port in enumerate(self.ports):
                where = self.folder / f"node{i}/out.log"
                wait_for(
                    functools.partial(accepts, port), f"RabbitMQ node {i} ({where})", timeout_s
                )
            # A listener is up before its node takes MQTT sessions (the cluster still forming).
            for i, port in enumerate(self.ports):
                where = self.folder / f"node{i}/out.log"
                wait_for(functools.partial(mqtt_answers, port), f"MQTT on node {i} ({where})", 120)
        except BaseException:
            self.stop()  # a cluster that never formed leaves no node running
            raise

    def start_node(self, i: int) -> None:
        """Start node `i` (again): its own session and process group."""
        env = self._node_env(i)
        with (self.folder / f"node{i}/out.log").open("ab") as log:
            self.procs[i] = subprocess.Popen(
                [str(RABBITMQ_SERVER)],
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=open_files(65536),  # noqa: PLW1509 - no threads in the child yet
            )

    def stop_node(self, i: int) -> None:
        """Stop node `i` (SIGTERM to its process group; SIGKILL after 60 s)."""
        proc = self.procs[i]
        if proc is not None:
            stop_pid(proc, 60.0, group=True)
        self.procs[i] = None

    def stop(self) -> None:
        """Stop every node, then epmd."""
        for i in range(len(self.procs)):
            self.stop_node(i)
        if self.epmd is not None:
            stop_pid(self.epmd)
            self.epmd = None

    def pids(self) -> list[int]:
        """The running nodes' process ids (their Erlang VMs are found under them)."""
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

    def settings(self, node: int = 0, **kw: object) -> MqttSettings:
        """Client settings for `node`, failing over to the others, MQTT 3.1.1."""
        rest = tuple(b for k, b in enumerate(self.brokers) if k != node)
        base: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.ports[node],
            "brokers": rest,
            "client_id": random_client_id("bench"),
            "persistent_session": False,
            "protocol": Protocol.V311,
        }
        return MqttSettings(**{**base, **kw})  # type: ignore[arg-type]
