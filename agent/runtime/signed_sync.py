"""The signed sync of a running agent: one `SyncLoop`, run on a schedule and by the fleet.

Built only when `[sync]` is on (it needs the model cache); boto3 and python-tuf are imported
only then. The schedule is entered last into the start-up exit stack, so on shutdown the cycle
in progress finishes before anything but the listeners stops, within the stop budget's drain
deadline (`agent.runtime.shutdown`): past it the cycle is cut short, which the cache allows
(an install is atomic; the next start syncs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config.schema import AgentConfig
from agent.errors import AgentError, ModelLoadError
from agent.models.cache_control import CachedVersions, ProvenanceOf
from agent.models.events import EventTee
from agent.runtime.shutdown import StopBudget
from sync.errors import SyncConfigError, SyncError
from sync.policy import parse_desired
from sync.provenance import ProvenanceStore

if TYPE_CHECKING:
    from model_cache.versions import ModelCache
    from sync.client import SyncClient
    from sync.periodic import SyncLoop

__all__ = [
    "AgentSync",
    "build_sync",
    "desired_from_fleet",
    "provenance_reader",
    "start_periodic_sync",
    "sync_now",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentSync:
    """The signed sync of a running agent: one loop, shared by the schedule and the fleet."""

    client: SyncClient
    loop: SyncLoop


def provenance_reader(config: AgentConfig, cache: ModelCache) -> ProvenanceOf:
    """Who signed a cached version, as the sync recorded it (also after `sync --once`)."""
    store = ProvenanceStore((config.sync.work_dir or Path(cache.root) / "sync") / "provenance")

    def read(model: str, version: int) -> dict[str, Any] | None:
        found = store.get(model, version)
        return found.to_json() if found is not None else None

    return read


def build_sync(
    config: AgentConfig,
    model_cache: ModelCache | None,
    versions: CachedVersions | None,
    events: EventTee,
) -> AgentSync | None:
    """The sync client and its loop when `[sync]` is on (it needs the cache); nothing runs yet.

    Raises:
        ModelLoadError: the sync settings or the trusted root cannot be used.
    """
    if not config.sync.enabled or model_cache is None or versions is None:
        return None
    # boto3 and python-tuf (~26 MiB) are imported only for an agent that syncs.
    from sync.periodic import SyncLoop, build_client  # noqa: PLC0415

    try:
        client = build_client(config.sync, model_cache)
    except SyncError as exc:
        raise ModelLoadError(f"sync: {exc.message}") from None
    loop = SyncLoop(
        client,
        model_cache,
        versions.activate,
        events=events.record,  # failures and recoveries: once each, to the fleet
        remind_after_s=config.sync.remind_after_s,
    )
    return AgentSync(client, loop)


async def start_periodic_sync(
    stack: contextlib.AsyncExitStack, config: AgentConfig, sync: AgentSync, budget: StopBudget
) -> None:
    """Run the sync on its schedule until the stack unwinds (the cycle in progress completes,
    or is cut short at the stop budget's drain deadline)."""
    from sync.periodic import run_schedule  # noqa: PLC0415 - with build_client, above

    stop = asyncio.Event()
    task = asyncio.create_task(run_schedule(sync.loop, config.sync, stop))

    async def finish() -> None:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=budget.drain_left())
        if done:
            task.result()  # its error, if any
            return
        logger.warning(
            "the sync cycle in progress was cut short by the stop budget "
            "(server.stop_timeout_ms); the next start syncs again"
        )
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(finish)


async def sync_now(sync: AgentSync) -> dict[str, object]:
    """The fleet's `sync`: one cycle of the same loop (its failures told once).

    Raises:
        AgentError: the cycle failed (the message says why).
    """
    result = await sync.loop.cycle()
    if not result.ok or result.report is None:
        raise AgentError(f"sync failed: {result.error}")
    return {
        "installed": [list(p) for p in result.report.installed],
        "activated": [list(p) for p in result.activated],
        "rejected": [list(p) for p in result.rejected],
        "errors": [list(e) for e in result.report.errors],
    }


def desired_from_fleet(
    client: SyncClient, configured: tuple[str, ...], lines: tuple[str, ...]
) -> None:
    """The fleet's `set-desired` replaces `sync.desired` for the running sync; none stored: the
    config's stands. Takes effect at the next cycle (or at once with the `sync` command)."""
    try:
        client.set_desired(parse_desired(lines or configured))
    except SyncConfigError as exc:  # the command was validated; a stored row may be older
        logger.error("desired state from the fleet ignored: %s", exc.message)
        return
    logger.info("sync now wants %s", ", ".join(lines or configured))
