"""Composition root: build the registry, data plane and HTTP server; run until SIGTERM/SIGINT.

Shutdown order: stop being ready, close the listener and finish in-flight requests, unload models.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from aiohttp import web

from agent.api.grpc_server import start_grpc_server
from agent.api.http import create_app
from agent.api.metrics import build_registry, create_metrics_app
from agent.canary.control import STATE_FILE, CanaryManager
from agent.config.schema import AgentConfig
from agent.errors import AgentError, ModelLoadError, ModelNotFoundError
from agent.fleet.link import EventTee, FleetLink
from agent.fleet.telemetry import detect_gpu
from agent.models.cache_control import CachedVersions, CacheEvents
from agent.models.control import LogEvents, ModelControlMode, ModelManager
from agent.models.memory_plan import MemoryLedger, detect_budget_bytes, process_rss_bytes
from agent.models.registry import LoadSettings, ModelRegistry
from agent.repository.watch import RepositoryWatcher
from agent.runtime.demo import default_demo_dir, ensure_demo_repository
from agent.runtime.reload import Reloader
from agent.runtime.systemd_notify import (
    Notifier,
    StatusLogHandler,
    WatchdogPinger,
    install_stall_hook,
)
from agent.scheduling.rate_limiter import RateLimiter
from agent.scheduling.scheduler import LimiterGate
from agent.scheduling.statistics import StatisticsRegistry
from agent.serving.dataplane import DataPlane
from agent.serving.response_cache import ResponseCache
from agent.serving.shared_memory import SharedMemoryRegistry
from model_cache import CacheError, ModelCache
from sync.errors import SyncError

if TYPE_CHECKING:
    from sync.client import SyncClient

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0  # SIGTERM: bound on in-flight requests (unit: TimeoutStopSec=45s)


@dataclass(slots=True)
class RunningAgent:
    """A started agent: its parts and the port it listens on."""

    registry: ModelRegistry
    dataplane: DataPlane
    runner: web.AppRunner
    http_port: int
    metrics_runner: web.AppRunner | None = None
    metrics_port: int | None = None
    model_cache: ModelCache | None = None
    watcher: RepositoryWatcher | None = None
    sync_stop: asyncio.Event | None = None
    sync_task: asyncio.Task[None] | None = None
    grpc_server: grpc.aio.Server | None = None
    grpc_port: int | None = None
    fleet: FleetLink | None = None

    async def stop(self) -> None:
        """Stop accepting work, let in-flight requests finish, unload models."""
        self.dataplane.set_ready(False)
        if self.sync_stop is not None:
            self.sync_stop.set()
        if self.sync_task is not None:
            await self.sync_task  # finish the cycle in progress; never cut an install short
        if self.fleet is not None:
            await self.fleet.stop()  # publishes the retained "offline" status
        if self.watcher is not None:
            await self.watcher.stop()
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=30)  # in-flight calls finish within the bound
        await self.runner.cleanup()
        if self.metrics_runner is not None:
            await self.metrics_runner.cleanup()
        await asyncio.to_thread(self.registry.close)
        if self.model_cache is not None:
            self.model_cache.close()
        logger.info("agent stopped")


async def start_agent(config: AgentConfig) -> RunningAgent:
    """Load the repository and start listening.

    Raises:
        ModelLoadError: with exit_on_error, a model failed to load (the message names each one).
        OSError: the HTTP port cannot be bound.
    """
    repo = config.models.repository
    model_cache: ModelCache | None = None
    if config.cache.dir is not None:
        model_cache = await asyncio.to_thread(_open_cache, config)
        repo = model_cache.repository_path
    elif repo is None:
        try:
            repo = await asyncio.to_thread(ensure_demo_repository, default_demo_dir())
        except RuntimeError as exc:
            raise ModelLoadError(str(exc)) from None
        logger.info("serving the demo repository at %s", repo)
    budget, source = detect_budget_bytes(config.models.memory_budget_bytes or None)
    ledger = MemoryLedger(budget)
    # The budget covers the models; the agent's own start-up memory is counted against it first.
    ledger.reserve(("edge-agent", "base"), min(process_rss_bytes(), budget // 2))
    logger.info("memory budget %d MiB (%s)", budget >> 20, source)
    stats = StatisticsRegistry()
    registry = ModelRegistry(
        repo,
        LoadSettings(
            auto_complete=not config.models.strict_model_config,
            intra_op_threads=config.models.intra_op_threads,
            max_queue_size=config.models.max_queue_size,
            engine_cache_root=config.cache.dir,
        ),
        stats=stats,
        ledger=ledger,
        gate=LimiterGate(RateLimiter()),
    )
    mode = ModelControlMode(config.models.control_mode)
    events = EventTee(CacheEvents(model_cache) if model_cache is not None else LogEvents())
    manager = ModelManager(registry, events)
    watcher: RepositoryWatcher | None = None
    if mode is ModelControlMode.POLL:
        # Started before the initial load so that no change in between is missed.
        watcher = RepositoryWatcher(
            repo,
            functools.partial(_reload, manager),
            on_removed=functools.partial(_unload_if_known, manager),
            quiet_s=config.models.poll_quiet_ms / 1000,
        )
        await watcher.start()
    failures = await asyncio.to_thread(_initial_load, registry, mode, config.models.load_models)
    if failures and config.models.exit_on_error:
        if watcher is not None:
            await watcher.stop()
        await asyncio.to_thread(registry.close)
        if model_cache is not None:
            model_cache.close()
        detail = "; ".join(f"{name}: {reason}" for name, reason in sorted(failures.items()))
        raise ModelLoadError(f"failed to load {len(failures)} model(s): {detail}")
    cache = ResponseCache(config.models.response_cache_bytes)
    versions = (
        CachedVersions(
            model_cache,
            manager,
            keep_last=config.cache.keep_last,
            disk_budget_bytes=config.cache.disk_budget_bytes or None,
        )
        if model_cache is not None
        else None
    )
    # Pins and running canaries persist only where the agent keeps state: its cache directory.
    canary = CanaryManager(
        registry,
        events,
        state_path=config.cache.dir / STATE_FILE if config.cache.dir is not None else None,
    )
    canary.startup(config.canary)
    dataplane = DataPlane(
        registry,
        cache,
        manager,
        mode,
        versions,
        canary,
        shared_memory=SharedMemoryRegistry(enabled=config.server.shared_memory),
    )
    sync_stop = asyncio.Event()
    sync_task: asyncio.Task[None] | None = None
    sync_client: SyncClient | None = None
    if config.sync.enabled and versions is not None and model_cache is not None:
        try:
            # boto3 and python-tuf (~26 MiB) are imported only for an agent that syncs.
            from sync.periodic import build_client, run_periodic  # noqa: PLC0415

            sync_client = build_client(config.sync, model_cache)
        except SyncError as exc:
            raise ModelLoadError(f"sync: {exc.message}") from None
        sync_task = asyncio.create_task(
            run_periodic(
                config.sync,
                model_cache,
                versions.activate,
                sync_stop,
                client=sync_client,
                events=events.record,  # sync failures and recoveries: once each, to the fleet
            )
        )
    app = create_app(dataplane, max_request_bytes=config.server.max_request_bytes)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=DRAIN_TIMEOUT_S
    )
    metrics_runner: web.AppRunner | None = None
    grpc_server: grpc.aio.Server | None = None
    grpc_port: int | None = None
    try:
        port = await _listen(runner, config.server.host, config.server.http_port)
        if config.server.grpc_port >= 0:
            grpc_server, grpc_port = await start_grpc_server(
                dataplane,
                config.server.host,
                config.server.grpc_port,
                max_message_bytes=config.server.max_request_bytes,
            )
        metrics_port = None
        if config.server.metrics_port >= 0:
            metrics_runner = web.AppRunner(
                create_metrics_app(build_registry(stats, ledger, canary=canary)),
                access_log=None,
                handle_signals=False,
            )
            metrics_port = await _listen(
                metrics_runner, config.server.host, config.server.metrics_port
            )
    except OSError:
        if watcher is not None:
            await watcher.stop()
        if grpc_server is not None:
            await grpc_server.stop(None)
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await asyncio.to_thread(registry.close)
        if model_cache is not None:
            model_cache.close()
        raise
    fleet: FleetLink | None = None
    if config.mqtt.enabled:
        fleet = await _start_fleet_link(
            config, dataplane, registry, ledger, model_cache, versions, sync_client, events
        )
    dataplane.set_ready(True)
    served = ", ".join(sorted(m.name for m in registry.served_models())) or "none"
    if metrics_port is not None:
        logger.info("metrics on http://%s:%d/metrics", config.server.host, metrics_port)
    if grpc_port is not None:
        logger.info("gRPC on %s:%d", config.server.host, grpc_port)
    logger.info("listening on http://%s:%d (models: %s)", config.server.host, port, served)
    return RunningAgent(
        registry,
        dataplane,
        runner,
        port,
        metrics_runner,
        metrics_port,
        model_cache,
        watcher,
        sync_stop,
        sync_task,
        grpc_server,
        grpc_port,
        fleet,
    )


async def _start_fleet_link(
    config: AgentConfig,
    dataplane: DataPlane,
    registry: ModelRegistry,
    ledger: MemoryLedger,
    model_cache: ModelCache | None,
    versions: CachedVersions | None,
    sync_client: SyncClient | None,
    events: EventTee,
) -> FleetLink:
    """Connect to the fleet manager's broker (returns at once; the broker may be away)."""
    sync_now: Callable[[], Awaitable[dict[str, object]]] | None = None
    if sync_client is not None and versions is not None:
        client, cached = sync_client, versions
        sync_lock = asyncio.Lock()

        async def run_sync_now() -> dict[str, object]:
            async with sync_lock:
                try:
                    report = await asyncio.to_thread(client.sync_once)
                except SyncError as exc:
                    events.record("*", None, "sync_failed", {"reason": exc.message})
                    raise AgentError(f"sync failed: {exc.message}") from None
            for model, version in report.activate:
                await cached.activate(model, version)
            return {
                "installed": [list(p) for p in report.installed],
                "activated": [list(p) for p in report.activate],
                "errors": [list(e) for e in report.errors],
            }

        sync_now = run_sync_now
    state_dir = config.mqtt.state_dir or config.cache.dir or Path.home() / ".local/state/edge-agent"
    fleet = FleetLink(
        config.mqtt,
        dataplane,
        registry,
        ledger,
        state_dir / "fleet.sqlite",
        sync=sync_now,
        cache_disk=model_cache.disk_usage if model_cache is not None else None,
        gpu=await asyncio.to_thread(detect_gpu),
    )
    events.add(fleet)
    await fleet.start()
    return fleet


async def _reload(manager: ModelManager, name: str) -> None:
    """Poll mode: a model folder changed and is complete."""
    await manager.load(name)


async def _unload_if_known(manager: ModelManager, name: str) -> None:
    """Poll mode: a model folder was removed."""
    with contextlib.suppress(ModelNotFoundError):
        await manager.unload(name)


def _open_cache(config: AgentConfig) -> ModelCache:
    """Open (and recover) the model cache; raises ModelLoadError when it cannot be used."""
    assert config.cache.dir is not None
    try:
        cache = ModelCache(
            config.cache.dir, disk_budget_bytes=config.cache.disk_budget_bytes or None
        )
    except CacheError as exc:
        raise ModelLoadError(f"model cache {config.cache.dir}: {exc}") from None
    report = cache.last_recovery
    logger.info("model cache %s opened (recovery: %s)", config.cache.dir, report)
    return cache


def _initial_load(
    registry: ModelRegistry, mode: ModelControlMode, names: tuple[str, ...]
) -> dict[str, str]:
    """Triton's start-up rule: all models, except in explicit mode only those named."""
    if mode is not ModelControlMode.EXPLICIT or "*" in names:
        return registry.load_all()
    failures: dict[str, str] = {}
    for name in names:
        try:
            registry.load_model(name)
        except AgentError as exc:
            failures[name] = exc.message
    return failures


async def _listen(runner: web.AppRunner, host: str, port: int) -> int:
    """Start a runner on host:port; returns the bound port (useful with port 0)."""
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return int(runner.addresses[0][1])


async def run_agent(
    config: AgentConfig, reload_config: Callable[[], AgentConfig] | None = None
) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code.

    Under systemd (`NOTIFY_SOCKET` set): STATUS= lines while loading, READY=1 once every model is
    loaded and the ports listen, WATCHDOG=1 from this event loop, RELOADING=1 then READY=1 around
    a SIGHUP reload, STOPPING=1 on SIGTERM/SIGINT. `reload_config` re-reads the config (file,
    environment, flags) on SIGHUP; None: SIGHUP is logged and ignored.
    """
    loop = asyncio.get_running_loop()
    notifier = Notifier.from_environ()
    pinger = WatchdogPinger.from_environ(notifier)
    # Until the reloader is installed, SIGHUP must not kill the agent (its default action).
    loop.add_signal_handler(signal.SIGHUP, logger.warning, "SIGHUP ignored: not running yet")
    install_stall_hook(loop)  # test-only: does nothing unless EDGE_AGENT_STALL_ON_SIGUSR1 is set
    pinger.start()
    progress = StatusLogHandler(notifier)
    logging.getLogger("agent").addHandler(progress)
    notifier.status("loading models")
    try:
        agent = await start_agent(config)
    except BaseException:
        await pinger.stop()
        raise
    finally:
        logging.getLogger("agent").removeHandler(progress)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloader: Reloader | None = None
    if reload_config is not None:
        reloader = Reloader(config, reload_config, agent.registry, notifier)
        reloader.install(loop)
    served = len(agent.registry.served_models())
    notifier.ready(f"serving {served} model(s) on port {agent.http_port}")
    await stop.wait()
    logger.info("stopping on signal")
    notifier.stopping("draining in-flight requests")
    loop.remove_signal_handler(signal.SIGHUP)
    try:
        await agent.stop()
    finally:
        await pinger.stop()  # pings go on during the drain
        notifier.close()
    return 0
