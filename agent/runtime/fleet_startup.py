"""The fleet link of a running agent: its MQTT connection, wired to the signed sync.

The link is entered into the start-up exit stack before it starts, so a start that fails half
way (state database opened, TLS files unreadable) is undone like the rest; stopping it
publishes the retained "offline" status.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config.schema import AgentConfig
from agent.device.gpu import GpuReader
from agent.errors import AgentError
from agent.fleet.inventory import cache_digests, targets_key_ids
from agent.fleet.link import FleetLink
from agent.models.events import EventTee
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.runtime.signed_sync import AgentSync, desired_from_fleet, sync_now
from agent.serving.dataplane import DataPlane
from agent.wire.mqtt import MqttError
from agent.wire.sqlite import StoreError

if TYPE_CHECKING:
    from model_cache.versions import ModelCache


__all__ = ["start_fleet_link"]


async def start_fleet_link(
    stack: contextlib.AsyncExitStack,
    config: AgentConfig,
    dataplane: DataPlane,
    registry: ModelRegistry,
    ledger: MemoryLedger,
    model_cache: ModelCache | None,
    sync: AgentSync | None,
    events: EventTee,
    gpu: GpuReader | None,
) -> FleetLink:
    """Connect to the fleet manager's broker (returns at once; the broker may be away).

    Raises:
        AgentError: the link's state database or TLS files cannot be opened (what it had opened
            is closed again).
    """
    run_sync: Callable[[], Awaitable[dict[str, object]]] | None = None
    on_desired: Callable[[tuple[str, ...]], None] | None = None
    sync_state: Callable[[], Mapping[str, Any]] | None = None
    if sync is not None:
        run_sync = functools.partial(sync_now, sync)
        on_desired = functools.partial(desired_from_fleet, sync.client, config.sync.desired)
        sync_state = sync.loop.state
    state_dir = config.mqtt.state_dir or config.cache.dir or Path.home() / ".local/state/edge-agent"
    fleet = FleetLink(
        config.mqtt,
        dataplane,
        registry,
        ledger,
        state_dir / "fleet.sqlite",
        sync=run_sync,
        on_desired=on_desired,
        sync_state=sync_state,
        cache_disk=model_cache.disk_usage if model_cache is not None else None,
        gpu=gpu,
        digests=cache_digests(model_cache) if model_cache is not None else None,
        key_ids=(functools.partial(targets_key_ids, sync.client.metadata_dir) if sync else None),
    )
    # Entered before it starts: a start that fails half way (state database opened, TLS files
    # unreadable) is undone like the rest. Stopping publishes the retained "offline" status.
    stack.push_async_callback(fleet.stop)
    try:
        await fleet.start()
    except (StoreError, MqttError, OSError) as exc:
        raise AgentError(f"fleet link: {exc}") from None
    events.add(fleet)
    return fleet
