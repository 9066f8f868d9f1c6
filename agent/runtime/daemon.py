"""Composition root: build every part, serve until SIGTERM/SIGINT, stop every part.

Start-up enters each part into one `AsyncExitStack` as it starts: the model cache, the registry
(and with it every loaded model), the repository watcher, the HTTP, gRPC and metrics listeners,
the fleet link, the periodic sync. Shutdown unwinds that stack in reverse order after the agent
stops being ready, and a start-up that fails half way unwinds it too, so no path leaves a port,
task, thread or lock behind. The whole stop has one budget (`agent.runtime.shutdown`,
`server.stop_timeout_ms`), under the systemd unit's stop timeout: the listeners drain first,
all at once, then the stack unwinds in what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from agent.api.access import ApiAccess
from agent.api.http.app import create_app
from agent.api.http.lane import INFER_LANE, InferLane
from agent.api.tls import ServerTls
from agent.canary.control import STATE_FILE, CanaryManager
from agent.config.schema import AgentConfig, restart_policy
from agent.config.security import (
    exposure_problems,
    grpc_restrictions,
    http_restrictions,
    tls_files,
)
from agent.device.gpu import CachedGpuReader, detect_gpu_reader
from agent.errors import AgentConfigError, MemoryBudgetError, ModelLoadError
from agent.fleet.telemetry import TelemetrySampler
from agent.models.cache_control import CachedVersions, CacheEvents
from agent.models.control import ModelControlMode, ModelManager
from agent.models.device_memory import detect_device_memory
from agent.models.events import EventTee, LogEvents
from agent.models.loader import LoadSettings
from agent.models.memory_plan import MemoryLedger, detect_budget_bytes, process_rss_bytes
from agent.models.registry import ModelRegistry
from agent.runtime.demo import default_demo_dir, ensure_demo_repository
from agent.runtime.fd_limit import raise_open_file_limit
from agent.runtime.listeners import Listeners, connection_limits, tls_note
from agent.runtime.model_startup import (
    initial_load,
    open_cache,
    pushed_models,
    watch_repository,
)
from agent.runtime.reload import Reloader
from agent.runtime.shutdown import StopBudget, exit_when_spent
from agent.runtime.signed_sync import build_sync, provenance_reader, start_periodic_sync
from agent.runtime.status import DeviceStatus, status_token
from agent.runtime.systemd_notify import (
    Notifier,
    StatusLogHandler,
    WatchdogPinger,
    install_stall_hook,
)
from agent.runtime.tracing import build_tracer
from agent.scheduling.rate_limiter import RateLimiter
from agent.scheduling.scheduler import LimiterGate
from agent.scheduling.statistics import StatisticsRegistry
from agent.serving.cuda_regions import open_cuda_regions
from agent.serving.dataplane import DataPlane
from agent.serving.response_cache import ResponseCache
from agent.serving.shared_memory import SharedMemoryRegistry

if TYPE_CHECKING:
    # MQTT (paho) only with [mqtt]; the cache (SQLite) only with cache.dir: imported when used.
    from agent.fleet.link import FleetLink
    from model_cache.versions import ModelCache

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RunningAgent:
    """A started agent: its parts, the ports it listens on, and how to stop it."""

    registry: ModelRegistry
    dataplane: DataPlane
    http_port: int
    stack: contextlib.AsyncExitStack
    listeners: Listeners
    budget: StopBudget  # the whole stop's (server.stop_timeout_ms)
    http_app: web.Application
    metrics_port: int | None = None
    model_cache: ModelCache | None = None
    grpc_port: int | None = None
    fleet: FleetLink | None = None
    tls: ServerTls | None = None  # reloaded on SIGHUP
    access: ApiAccess | None = None  # restricted API groups, swapped on SIGHUP
    infer_lane: InferLane | None = None  # the HTTP listener's (what it served, handed over)

    async def stop(self) -> None:
        """Stop being ready, stop the listeners, then every other part in the reverse order of
        its start, all within the stop budget (`agent.runtime.shutdown`).

        The listeners stop accepting and drain together (in-flight requests answered until the
        budget's drain deadline, then cancelled); then the sync cycle in progress finishes (cut
        short at the drain deadline), the fleet link publishes its retained "offline" status,
        the models are unloaded and the cache is closed.
        """
        self.budget.begin()
        self.dataplane.set_ready(False)
        try:
            await self.listeners.stop()
        finally:
            await self.stack.aclose()
        logger.info(
            "agent stopped in %.1f s (budget %.1f s)", self.budget.elapsed(), self.budget.total_s
        )


async def start_agent(config: AgentConfig) -> RunningAgent:
    """Load the repository and start listening.

    Every part is entered into one exit stack as it starts: if start-up fails half way, the
    parts already started are stopped in reverse order before the error propagates, and
    `RunningAgent.stop` unwinds the same stack.

    Raises:
        ModelLoadError: with exit_on_error, a model failed to load (the message names each one);
            the model cache or sync could not be set up.
        OSError: a port cannot be bound.
    """
    stack = contextlib.AsyncExitStack()
    stop_budget = StopBudget(config.server.stop_timeout_ms / 1000)
    try:
        return await _start(config, stack, stop_budget)
    except BaseException:
        stop_budget.begin()
        await stack.aclose()
        raise


async def _start(
    config: AgentConfig, stack: contextlib.AsyncExitStack, stop_budget: StopBudget
) -> RunningAgent:
    raise_open_file_limit()
    for problem in exposure_problems(config.server):  # strict_security refused it at load
        logger.warning("security: %s", problem)
    access = ApiAccess(http_restrictions(config.server), grpc_restrictions(config.server))
    files = tls_files(config.server)
    tls = await asyncio.to_thread(ServerTls, files) if files is not None else None
    repo = config.models.repository
    model_cache: ModelCache | None = None
    if config.cache.dir is not None:
        model_cache = await asyncio.to_thread(open_cache, config)
        stack.callback(model_cache.close)
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
    # Then the requests in flight: kept before any model plans, so a full repository still
    # leaves room to serve.
    try:
        inflight = ledger.keep_for_inflight(config.models.inflight_memory_bytes)
    except MemoryBudgetError:
        raise AgentConfigError(
            f"models.inflight_memory_bytes ({config.models.inflight_memory_bytes}) is more than "
            f"the {ledger.left() >> 20} MiB the memory budget has left after the agent itself"
        ) from None
    logger.info(
        "memory budget %d MiB (%s), %d MiB of it for requests in flight",
        budget >> 20,
        source,
        inflight.capacity_bytes >> 20,
    )
    stats = StatisticsRegistry()
    registry = ModelRegistry(
        repo,
        LoadSettings(
            auto_complete=not config.models.strict_model_config,
            intra_op_threads=config.models.intra_op_threads,
            max_queue_size=config.models.max_queue_size,
            engine_cache_root=config.cache.dir,
            max_request_bytes=config.server.max_request_bytes,
            restart_policy=restart_policy(config.models),
            allow_cpu_fallback=config.models.allow_cpu_fallback,
        ),
        stats=stats,
        ledger=ledger,
        gate=LimiterGate(RateLimiter()),
    )
    # GPU memory checked at each GPU version's load, beside the host budget (none on Jetson).
    device_memory, device_why = await asyncio.to_thread(detect_device_memory)
    registry.loader.device_memory = device_memory
    logger.info("device memory: %s", device_why)
    # Folders of models loaded from request files: removed after the models are unloaded.
    pushed = (
        pushed_models(config, stack)
        if config.models.control_mode is ModelControlMode.EXPLICIT
        else None
    )
    stack.push_async_callback(asyncio.to_thread, registry.close)
    mode = config.models.control_mode
    events = EventTee(CacheEvents(model_cache) if model_cache is not None else LogEvents())
    # Instances that fail and restart are events too; a version that gives up is taken out of
    # service on this loop.
    registry.events = events
    registry.bind_loop(asyncio.get_running_loop())
    manager = ModelManager(registry, events)
    if mode is ModelControlMode.POLL:
        # Started before the initial load so that no change in between is missed.
        await watch_repository(stack, config, repo, manager)
    failures = await asyncio.to_thread(initial_load, registry, mode, config.models.load_models)
    if failures and config.models.exit_on_error:
        detail = "; ".join(f"{name}: {reason}" for name, reason in sorted(failures.items()))
        raise ModelLoadError(f"failed to load {len(failures)} model(s): {detail}")
    versions = (
        CachedVersions(
            model_cache,
            manager,
            keep_last=config.cache.keep_last,
            disk_budget_bytes=config.cache.disk_budget_bytes or None,
            provenance=provenance_reader(config, model_cache),
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
    shared_memory = SharedMemoryRegistry(enabled=config.server.shared_memory)
    if config.server.shared_memory:
        # CUDA regions where cuda-python and a GPU are here (no CUDA context until a register).
        cuda_regions, why = await asyncio.to_thread(
            open_cuda_regions, lambda name: any(r.name == name for r in shared_memory.status())
        )
        shared_memory.device = cuda_regions
        logger.info("CUDA shared memory: %s", why if cuda_regions is not None else f"off, {why}")
    dataplane = DataPlane(
        registry,
        ResponseCache(config.models.response_cache_bytes),
        manager,
        mode,
        versions,
        canary,
        shared_memory=shared_memory,
        pushed=pushed,
        max_request_bytes=config.server.max_request_bytes,
        tracer=build_tracer(config),
        server_name=config.server.name,
        private_paths=[config.cache.dir] if config.cache.dir is not None else [],
        strict_readiness=config.server.strict_readiness,
    )
    # `/v2/logging` starts at `log.level` (Triton: INFO records on by default), as SIGHUP resets
    # it, also where the agent runs inside another process that set up logging its own way.
    dataplane.log_settings.set_level(config.log.level)
    # Entered before the listeners: stopped after them, once no request can finish a trace.
    stack.push_async_callback(asyncio.to_thread, dataplane.tracer.close)
    sync = build_sync(config, model_cache, versions, events)
    server = config.server
    limits = connection_limits(config)
    found_gpu = await asyncio.to_thread(detect_gpu_reader)
    # One reading per interval (Triton's), shared by scrapes, telemetry and the status page.
    gpu = CachedGpuReader(found_gpu, time.monotonic, 2.0) if found_gpu is not None else None
    token = status_token(server)
    status = DeviceStatus(
        dataplane,
        TelemetrySampler(
            registry,
            ledger,
            started=time.monotonic(),
            cache_disk=model_cache.disk_usage if model_cache is not None else None,
            sync_state=sync.loop.state if sync is not None else None,
            gpu=gpu,
        ),
        access="loopback" if token is None else "token",
        interval_s=server.status_sample_ms / 1000,
    )
    events.add(status.events)
    await status.start()
    stack.push_async_callback(status.stop)
    app = create_app(
        dataplane,
        max_request_bytes=server.max_request_bytes,
        max_bytes_elements=server.max_bytes_elements,
        limits=limits,
        access=access if "http" in access.enforced else None,
        status=status,
        status_token=lambda: token,
        infer_lane=server.http_infer_lane,
    )
    listeners = Listeners(stop_budget)
    stack.push_async_callback(listeners.stop)  # a start that fails after one bound stops it
    context = tls.ssl_context if tls is not None else None
    port = await listeners.serve_http(
        app, server.host, server.http_port, waited_for=True, ssl_context=context
    )
    grpc_port = await listeners.serve_grpc(config, dataplane, limits, access, tls)
    metrics_port = await listeners.serve_metrics(
        config, limits, tls, stats=stats, ledger=ledger, canary=canary, gpu=gpu
    )
    fleet: FleetLink | None = None
    if config.mqtt.enabled:
        from agent.runtime.fleet_startup import start_fleet_link  # noqa: PLC0415 - see imports

        fleet = await start_fleet_link(
            stack, config, dataplane, registry, ledger, model_cache, sync, events, gpu
        )
    if sync is not None:
        # Last in, first out: on shutdown the cycle in progress finishes (within the drain
        # deadline) before anything but the listeners stops.
        await start_periodic_sync(stack, config, sync, stop_budget)
    dataplane.set_ready(True)
    served = ", ".join(sorted(m.name for m in registry.served_models())) or "none"
    logger.info(
        "listening on %s://%s:%d (models: %s)%s",
        "https" if tls else "http",
        config.server.host,
        port,
        served,
        tls_note(tls),
    )
    return RunningAgent(
        registry,
        dataplane,
        port,
        stack,
        listeners,
        stop_budget,
        app,
        metrics_port=metrics_port,
        model_cache=model_cache,
        grpc_port=grpc_port,
        fleet=fleet,
        tls=tls,
        access=access,
        infer_lane=app.get(INFER_LANE),
    )


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
    async with contextlib.AsyncExitStack() as stack:
        notifier = Notifier.from_environ()
        stack.callback(notifier.close)
        pinger = WatchdogPinger.from_environ(notifier)
        # Until the reloader is installed, SIGHUP must not kill the agent (its default action).
        loop.add_signal_handler(signal.SIGHUP, logger.warning, "SIGHUP ignored: not running yet")
        stack.callback(loop.remove_signal_handler, signal.SIGHUP)
        install_stall_hook(loop)  # test-only: nothing unless EDGE_AGENT_STALL_ON_SIGUSR1 is set
        pinger.start()
        stack.push_async_callback(pinger.stop)  # pings go on during the drain
        progress = StatusLogHandler(notifier)
        logging.getLogger("agent").addHandler(progress)
        notifier.status("loading models")
        try:
            agent = await start_agent(config)
        finally:
            logging.getLogger("agent").removeHandler(progress)
        stack.push_async_callback(agent.stop)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if reload_config is not None:
            Reloader(
                config,
                reload_config,
                agent.registry,
                notifier,
                agent.dataplane.log_settings,
                tls=agent.tls,
                access=agent.access,
            ).install(loop)
        served = len(agent.registry.served_models())
        notifier.ready(f"serving {served} model(s) on port {agent.http_port}")
        await stop.wait()
        agent.budget.begin()
        # The last resort: a part that holds the process past the budget (a stuck thread)
        # meets this before it would meet systemd's SIGKILL (TimeoutStopSec).
        exit_when_spent(agent.budget)
        logger.info("stopping on signal (within %.1f s)", agent.budget.total_s)
        notifier.stopping("draining in-flight requests")
        loop.remove_signal_handler(signal.SIGHUP)
    return 0
