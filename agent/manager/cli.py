"""The fleet manager's side: `edge-agent fleet send DEVICE COMMAND [ARGS]` and `fleet watch`
(`fleet inventory`, `fleet rollout` and `fleet exporter`: `agent.manager.cli_manage`).

    edge-agent fleet send jetson-17 activate model=resnet version=3 --host broker
    edge-agent fleet send jetson-17 set-desired --args '{"models": {"*": "latest"}}'
    edge-agent fleet watch [DEVICE] [--json] [--count N]
    edge-agent fleet dashboard [--port 9500] [--bind 127.0.0.1] [--token T] [--rollouts FILE]

`send` subscribes to a private reply topic, publishes the command with a fresh id (MQTT 5
response topic and correlation data; under 3.1.1 it listens on the device's `responses` topic
and matches the id), prints the response and exits 0 when it says ok, 1 when it carries an
error, 3 when none came within `--timeout`. `ARGS` are `key=value` pairs; each value is read as
JSON when it parses (numbers, lists, objects), else as a string.

`FleetClient` is the same thing as a library (the tests drive the agent through it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from agent.manager import cli_manage as fleet_manage
from agent.manager.dashboard import Dashboard
from agent.manager.rollout_view import StoreRollouts
from agent.pages import is_loopback_host
from agent.wire.mqtt import (
    Message,
    MqttClient,
    MqttError,
    MqttSettings,
    Protocol,
    random_client_id,
)
from agent.wire.topics import Topics

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
_STREAM_BOUND = 1024  # messages buffered by `watch`


class FleetClient:
    """Sends commands to devices and streams what they publish.

    Use as `async with FleetClient(settings, prefix) as fleet:`; `settings.client_id` should be
    unique (see `agent.wire.mqtt.random_client_id`).
    """

    def __init__(self, settings: MqttSettings, prefix: str = "edge") -> None:
        self.prefix = prefix
        self._inbox: asyncio.Queue[Message] = asyncio.Queue(_STREAM_BOUND)
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._reply_topic = f"{prefix}/_fleet/{settings.client_id}/replies"
        self.client = MqttClient(settings, on_message=self._on_message)

    async def __aenter__(self) -> FleetClient:
        await self.client.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.client.stop()

    async def subscribe(self, topic: str) -> None:
        """Subscribe and wait for the broker's acknowledgement (and for the connection)."""
        await self.client.subscribe(topic)

    async def send(
        self, device: str, command: str, args: dict[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        """Send a command and wait for its response (bound it with `asyncio.timeout`).

        Keyword Args:
            command_id: Use this id (default: a random one); resending an id tests dedup.
            raw: Send these bytes instead of a JSON command built from the arguments.

        Returns:
            The response document.
        """
        command_id = kw.get("command_id") or uuid.uuid4().hex
        topics = Topics(self.prefix, device)
        await self.client.wait_connected()  # the protocol (5 or 3.1.1) is known from here on
        await self.subscribe(self._reply_topic if self.client.protocol == "5" else topics.responses)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[command_id] = future
        doc: dict[str, Any] = {"schema": 1, "id": command_id, "command": command}
        if args:
            doc["args"] = args
        payload = kw.get("raw") or json.dumps(doc).encode()
        try:
            await self.client.publish(
                topics.commands,
                payload,
                response_topic=self._reply_topic,
                correlation_data=command_id.encode(),
            )
            return await future
        finally:
            self._replies.pop(command_id, None)

    async def next_response(self) -> dict[str, Any]:
        """A response whose id this client did not send (e.g. to malformed raw payloads)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[""] = future
        return await future

    async def watch(self, device: str | None = None) -> None:
        """Subscribe to status, telemetry, events and responses of a device (None: all)."""
        level = device or "+"
        for leaf in ("status", "telemetry", "events", "responses"):
            await self.subscribe(f"{self.prefix}/{level}/{leaf}")

    async def messages(self) -> AsyncIterator[Message]:
        """What the `watch` subscriptions bring, in arrival order (bounded buffer)."""
        while True:
            yield await self._inbox.get()

    def _on_message(self, message: Message) -> None:
        if message.topic == self._reply_topic or message.topic.endswith("/responses"):
            try:
                doc = json.loads(message.payload)
            except json.JSONDecodeError:
                doc = None
            if isinstance(doc, dict):
                key = (
                    message.correlation_data.decode(errors="replace")
                    if (message.correlation_data)
                    else str(doc.get("id") or "")
                )
                future = self._replies.get(key) or self._replies.get("")
                if future is not None and not future.done():
                    future.set_result(doc)
                    if message.topic == self._reply_topic:
                        return
        if message.topic != self._reply_topic:
            if self._inbox.full():
                self._inbox.get_nowait()  # bounded: the oldest goes
            self._inbox.put_nowait(message)


def add_commands(subparsers: Any) -> None:  # argparse's _SubParsersAction is private
    """Add `fleet send` and `fleet watch` to the agent's sub-command parser.

    Args:
        subparsers: What `ArgumentParser.add_subparsers(dest="command")` returned.
    """
    fleet = subparsers.add_parser("fleet", help="talk to devices through the MQTT broker")
    verbs = fleet.add_subparsers(dest="fleet_command", required=True)
    send = verbs.add_parser("send", help="send a command and print the response")
    send.add_argument("device")
    send.add_argument("fleet_verb", metavar="COMMAND", help="status, ping, load, activate, ...")
    send.add_argument("args", nargs="*", metavar="KEY=VALUE")
    send.add_argument("--args", dest="args_json", metavar="JSON", help="arguments as an object")
    send.add_argument("--id", dest="command_id", help="command id (default: random)")
    send.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    watch = verbs.add_parser("watch", help="print status, events and telemetry as they arrive")
    watch.add_argument("device", nargs="?", help="default: every device")
    watch.add_argument("--json", action="store_true", help="print raw JSON payloads")
    watch.add_argument("--count", type=int, default=0, help="exit after N messages")
    board = verbs.add_parser("dashboard", help="serve a read-only web page of the fleet")
    board.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    board.add_argument(
        "--port", dest="http_port", type=int, default=9500, help="the page's port (default 9500)"
    )
    board.add_argument(
        "--token",
        default=os.environ.get("EDGE_AGENT_DASHBOARD_TOKEN", ""),
        help="requests must carry it (Authorization: Bearer, or ?token=); required beyond "
        "loopback (default: $EDGE_AGENT_DASHBOARD_TOKEN)",
    )
    board.add_argument(
        "--rollouts",
        type=Path,
        default=fleet_manage.DEFAULT_DB,
        help="the rollout manager's file, read-only (default: the `fleet rollout` --db default)",
    )
    for parser in (send, watch, board, *fleet_manage.add_verbs(verbs)):
        # The exporter's and dashboard's --port is their HTTP port; the broker's is --mqtt-port.
        own_port = parser.get_default("http_port") is not None
        parser.add_argument("--mqtt-host" if own_port else "--host", dest="host",
                            default="127.0.0.1")  # fmt: skip
        parser.add_argument("--mqtt-port" if own_port else "--port", dest="port", type=int,
                            default=1883)  # fmt: skip
        parser.add_argument("--prefix", default="edge", help="topic prefix (default edge)")
        parser.add_argument("--username", default="")
        parser.add_argument("--password", default="")
        parser.add_argument("--tls-ca", type=Path)
        parser.add_argument("--tls-cert", type=Path)
        parser.add_argument("--tls-key", type=Path)
        parser.add_argument("--protocol", choices=[p.value for p in Protocol], default="auto")
        parser.add_argument(
            "--brokers",
            type=broker_list,
            default=(),
            metavar="HOST:PORT,...",
            help="more brokers to fail over to, in turn (a cluster's other nodes)",
        )


def main(argv: Sequence[str]) -> int:
    """`edge-agent fleet ARGS` on its own: the manager's machine needs no serving stack (and no
    ONNX Runtime) to run it."""
    parser = argparse.ArgumentParser(prog="edge-agent")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["fleet", *argv]))


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run `fleet send` or `fleet watch`; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    settings = MqttSettings(
        host=args.host,
        port=args.port,
        brokers=args.brokers,
        client_id=random_client_id("fleet"),
        username=args.username,
        password=args.password,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        protocol=Protocol(args.protocol),
        persistent_session=False,
        reconnect_min_s=0.2,
        reconnect_max_s=2.0,
    )
    if args.fleet_command in fleet_manage.VERBS:
        return fleet_manage.run(args, settings, out, err)
    try:
        if args.fleet_command == "send":
            command_args = parse_args(args.args, args.args_json)
            return asyncio.run(_send(settings, args, command_args, out))
        if args.fleet_command == "dashboard":
            if not args.token and not is_loopback_host(args.bind):
                raise ValueError(f"--bind {args.bind} is beyond loopback: set --token")
            return asyncio.run(_dashboard(settings, args, out))
        return asyncio.run(_watch(settings, args, out))
    except ValueError as exc:
        print(f"edge-agent: error: {exc}", file=err)
        return EXIT_USAGE
    except TimeoutError:
        print(f"edge-agent: error: no response within {args.timeout} s", file=err)
        return EXIT_TIMEOUT
    except MqttError as exc:
        print(f"edge-agent: error: {exc}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK


def broker_list(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port,host:port` as (host, port) pairs.

    Raises:
        argparse.ArgumentTypeError: an entry is not HOST:PORT with a port in 1..65535.
    """
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"broker {item!r} is not HOST:PORT")
        found.append((host, int(port)))
    return tuple(found)


def parse_args(pairs: Sequence[str], as_json: str | None) -> dict[str, Any]:
    """Command arguments from `key=value` pairs and/or a JSON object.

    Raises:
        ValueError: a pair without `=`, or `as_json` that is not a JSON object.
    """
    result: dict[str, Any] = {}
    if as_json:
        doc = json.loads(as_json)
        if not isinstance(doc, dict):
            raise ValueError("--args must be a JSON object")
        result.update(doc)
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"argument {pair!r} is not KEY=VALUE")
        try:
            result[key] = json.loads(text)
        except json.JSONDecodeError:
            result[key] = text
    return result


async def _send(
    settings: MqttSettings, args: argparse.Namespace, command_args: dict[str, Any], out: TextIO
) -> int:
    async with FleetClient(settings, args.prefix) as fleet, asyncio.timeout(args.timeout):
        response = await fleet.send(
            args.device, args.fleet_verb, command_args, command_id=args.command_id
        )
    print(json.dumps(response, indent=2, sort_keys=True), file=out)
    return EXIT_OK if response.get("ok") else EXIT_FAILED


async def _watch(settings: MqttSettings, args: argparse.Namespace, out: TextIO) -> int:
    seen = 0
    async with FleetClient(settings, args.prefix) as fleet:
        await fleet.watch(args.device)
        async for message in fleet.messages():
            print(message.payload.decode(errors="replace") if args.json else _line(message),
                  file=out, flush=True)  # fmt: skip
            seen += 1
            if args.count and seen >= args.count:
                break
    return EXIT_OK


async def _dashboard(settings: MqttSettings, args: argparse.Namespace, out: TextIO) -> int:
    board = Dashboard(
        settings,
        prefix=args.prefix,
        rollouts=StoreRollouts(args.rollouts),
        token=args.token or None,
    )
    port = await board.start(args.bind, args.http_port)
    print(f"fleet dashboard on http://{args.bind}:{port}/", file=out, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await board.stop()
    return EXIT_OK


def _line(message: Message) -> str:
    """One readable line: topic, then the fields that matter for its kind."""
    try:
        doc = json.loads(message.payload)
    except json.JSONDecodeError:
        return f"{message.topic} (not JSON, {len(message.payload)} bytes)"
    if not isinstance(doc, dict):
        return f"{message.topic} {doc!r}"
    kind = doc.get("kind")
    if kind == "status":
        models = " ".join(f"{m['name']}:{m['versions']}" for m in doc.get("models", []))
        return f"{message.topic} {doc.get('state')} {models} {doc.get('reason', '')}".rstrip()
    if kind == "event":
        detail = json.dumps(doc.get("detail", {}), sort_keys=True)
        return f"{message.topic} #{doc.get('seq')} {doc.get('event')} {doc.get('model')} " + (
            f"v{doc.get('version')} {detail}"
        )
    if kind == "telemetry":
        parts = [
            f"{m['model']}:{m['version']} req={m['requests']} p95={m['latency_us'].get('p95')}us"
            for m in doc.get("models", [])
        ]
        return f"{message.topic} #{doc.get('seq')} up={doc.get('uptime_s')}s " + " ".join(parts)
    return f"{message.topic} {json.dumps(doc, sort_keys=True)}"
