"""Each fleet command id runs at most once; its response document is built here.

`CommandRunner.run(command)` executes a parsed command through the `CommandExecutor` unless its
id was seen before: a duplicate of a command still running waits for that run's response, a
duplicate of a finished one gets the stored response, and an id that began but never finished
(the agent restarted meanwhile) is answered with an error and not executed again. Every answer
is marked `"duplicate": true` when it is not a fresh run. The link stores fresh responses
(`FleetState.finish`) and sends them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.errors import AgentError, InternalError, ModelControlError
from agent.fleet import commands as cmd
from agent.fleet.documents import response_doc
from agent.fleet.executor import CommandExecutor
from agent.fleet.state import FleetState

logger = logging.getLogger(__name__)

__all__ = ["CommandRunner", "Envelope", "response_doc"]

Envelope = Callable[[str], dict[str, Any]]


class CommandRunner:
    """Runs commands at most once per id (call on the event loop)."""

    def __init__(self, state: FleetState, executor: CommandExecutor, envelope: Envelope) -> None:
        self._state = state
        self._executor = executor
        self._envelope = envelope
        self._running: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def run(self, command: cmd.Command) -> tuple[dict[str, Any], bool]:
        """The response to a command, and whether it ran now (False: a duplicate).

        Raises:
            StoreError: the state database failed while checking the id (nothing ran).
        """
        running = self._running.get(command.id)
        if running is not None:  # a duplicate of a command still executing: answer when done
            return {**await asyncio.shield(running), "duplicate": True}, False
        seen = self._state.seen(command.id)
        if seen is not None or not self._state.begin(command.id, command.name):
            stored = seen.response if seen is not None else None
            if stored is not None:
                return {**stored, "duplicate": True, "ts": time.time()}, False
            again = ModelControlError(
                f"command {command.id} was received before and did not finish "
                "(the agent restarted): not executed again"
            )
            answer = self._response(command, error=again)
            return {**answer, "duplicate": True}, False
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._running[command.id] = done
        try:
            result = await self._executor.execute(command.body)
            response = self._response(command, result=result)
        except Exception as exc:  # the command path must survive a bug (logged with traceback)
            if not isinstance(exc, AgentError):
                logger.exception("command %s (%s) failed", command.id, command.name)
            response = self._response(command, error=InternalError.wrap(exc))
        finally:
            del self._running[command.id]
        done.set_result(response)
        return response, True

    def _response(
        self,
        command: cmd.Command,
        *,
        result: Mapping[str, Any] | None = None,
        error: AgentError | None = None,
    ) -> dict[str, Any]:
        envelope = self._envelope("response")
        return response_doc(envelope, command.id, command.name, result=result, error=error)
