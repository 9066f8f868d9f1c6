"""Fleet commands in, responses out: the link's command queue and its answers.

Commands arrive on the commands topic (QoS 1). `status` and `ping` (`commands.READ_ONLY`) are
answered at once, at most `QUEUE` in flight; mutating commands wait in a bounded queue and run
one at a time, in arrival order, through the `CommandRunner` (each id at most once). Every
command is answered on its reply topic, a parse error or a full queue included; a failing state
database still gets an answer (`internal`) and makes the link `degraded` until a command goes
through again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError, InternalError, OverloadedError
from agent.fleet import commands as cmd
from agent.fleet.health import Health, why
from agent.fleet.runner import CommandRunner, Envelope, response_doc
from agent.fleet.state import FleetState
from agent.wire.mqtt import MqttError

__all__ = ["QUEUE", "CommandInbox", "Reply", "ReplySender"]

logger = logging.getLogger(__name__)

QUEUE = 32  # mutating commands waiting (and read-only ones in flight)


@dataclass(frozen=True, slots=True)
class Reply:
    """Where a command's response goes: its reply topic and MQTT 5 correlation data."""

    topic: str
    correlation: bytes | None


# Publish a response (topic, payload, correlation data); raises MqttError when paho's queue is
# full. The link's client may not be connected: the response is then dropped.
ReplySender = Callable[[str, bytes, "bytes | None"], None]


class CommandInbox:
    """Parses, queues, executes and answers the commands of one link (see module docstring)."""

    def __init__(
        self,
        runner: CommandRunner,
        state: FleetState,
        health: Health,
        envelope: Envelope,
        send: ReplySender,
        *,
        max_command_bytes: int,
    ) -> None:
        self._runner = runner
        self._state = state
        self._health = health
        self._envelope = envelope
        self._publish = send
        self._max_bytes = max_command_bytes
        self._queue: asyncio.Queue[tuple[cmd.Command, Reply]] = asyncio.Queue(QUEUE)
        self.inline: set[asyncio.Task[None]] = set()  # read-only commands being answered

    def receive(self, payload: bytes, reply: Reply) -> None:
        """A message on the commands topic (on the event loop): answer it or queue it."""
        try:
            command = cmd.parse_command(payload, max_bytes=self._max_bytes)
        except (cmd.CommandError, cmd.CommandTooLargeError) as exc:
            self._respond(reply, exc.command_id, None, error=exc)
            return
        if isinstance(command.body, cmd.READ_ONLY):
            if len(self.inline) >= QUEUE:
                self._respond(reply, command.id, command.name, error=OverloadedError("busy"))
                return
            task = asyncio.get_running_loop().create_task(self._handle(command, reply))
            self.inline.add(task)
            task.add_done_callback(self.inline.discard)
            return
        try:
            self._queue.put_nowait((command, reply))
        except asyncio.QueueFull:
            busy = OverloadedError(f"{QUEUE} commands are waiting; retry later")
            self._respond(reply, command.id, command.name, error=busy)

    async def command_loop(self) -> None:
        """Run the queued commands one at a time, in arrival order (runs until cancelled)."""
        while True:
            command, reply = await self._queue.get()
            await self._handle(command, reply)
            self._health.recovered("command loop")

    async def _handle(self, command: cmd.Command, reply: Reply) -> None:
        """Execute and answer one command.

        When the link's state database fails, the command is still answered (`internal` when it
        could not be checked for duplicates and did not run; its real response when only storing
        that response failed) and the link is `degraded` until a command goes through again.
        """
        try:
            response, ran = await self._runner.run(command)
        except Exception as exc:
            logger.exception("command %s (%s) could not be handled", command.id, command.name)
            self._health.fault("commands", why(exc))
            self._respond(reply, command.id, command.name, error=InternalError.wrap(exc))
            return
        try:
            if ran:
                self._state.finish(command.id, response)
        except Exception as exc:
            logger.exception("command %s (%s): response not stored", command.id, command.name)
            self._health.fault("commands", why(exc))
        else:
            self._health.recovered("commands")
        self._send(reply, response)

    def _respond(
        self,
        reply: Reply,
        command_id: str | None,
        name: str | None,
        *,
        error: AgentError,
    ) -> None:
        self._send(reply, response_doc(self._envelope("response"), command_id, name, error=error))

    def _send(self, reply: Reply, doc: Mapping[str, Any]) -> None:
        payload = json.dumps(doc, separators=(",", ":"), default=str).encode()
        try:
            self._publish(reply.topic, payload, reply.correlation)
        except MqttError as exc:
            logger.warning("response to %s not sent: %s", doc.get("id"), exc)
