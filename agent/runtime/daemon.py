"""Composition root: build every part, serve until SIGTERM/SIGINT, stop every part.

Start-up enters each part into one `AsyncExitStack` as it starts: the model cache, the registry
(and with it every loaded model), the repository watcher, the HTTP, gRPC and metrics listeners,
the fleet link, the periodic sync. Shutdown unwinds that stack in reverse order after the agent
stops being ready, and a start-up that fails half way unwinds it too, so no path leaves a port,
task, thread or lock behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent.api.access import ApiAccess, is_loopback_host
from agent.api.grpc_server import start_grpc_server
from agent.api.http import create_app
from agent.api.http_limits import ConnectionGuard, ConnectionLimits
from agent.api.metrics import build_registry, create_metrics_app
from agent.api.tls import ServerTls
from agent.canary.control import STATE_FILE, CanaryManager
from agent.config.schema import AgentConfig, ServerConfig
from agent.config.security import (
    exposure_problems,
    grpc_restrictions,
    http_restrictions,
    tls_files,
)
from agent.device.gpu import CachedGpuReader, GpuReader, detect_gpu_reader
from agent.errors import AgentError, ModelLoadError, ModelNotFoundError
from agent.fleet.inventory import cache_digests, targets_key_ids
from agent.fleet.link import FleetLink
from agent.fleet.mqtt import MqttError
from agent.fleet.outbox import StoreError
from agent.fleet.telemetry import TelemetrySampler
from agent.models.cache_control import CachedVersions, CacheEvents, ProvenanceOf
from agent.models.control import ModelControlMode, ModelManager
from agent.models.device_memory import detect_device_memory
from agent.models.events import EventTee, LogEvents
from agent.models.loader import LoadSettings
from agent.models.memory_plan import MemoryLedger, detect_budget_bytes, process_rss_bytes
from agent.models.pushed import PushedModels
from agent.models.registry import ModelRegistry
from agent.repository.watch import RepositoryWatcher
from agent.runtime.demo import default_demo_dir, ensure_demo_repository
from agent.runtime.fd_limit import raise_open_file_limit
from agent.runtime.reload import Reloader
from agent.runtime.status import DeviceStatus
from agent.runtime.systemd_notify import (
    Notifier,
    StatusLogHandler,
    WatchdogPinger,
    install_stall_hook,
)
from agent.scheduling.rate_limiter import RateLimiter
from agent.scheduling.scheduler import LimiterGate
from agent.scheduling.statistics import StatisticsRegistry
from agent.serving.cuda_regions import open_cuda_regions
from agent.serving.dataplane import DataPlane
from agent.serving.response_cache import ResponseCache
from agent.serving.shared_memory import SharedMemoryRegistry
from agent.serving.trace import Tracer
from agent.tensors.limits import TensorLimits
from model_cache import CacheError, ModelCache
from sync.errors import SyncConfigError, SyncError
from sync.policy import parse_desired
from sync.provenance import ProvenanceStore

if TYPE_CHECKING:
    from sync.client import SyncClient
    from sync.periodic import SyncLoop

logger = logging.getLogger(__name__)

# After an early answer (413, 408), the unread rest of a body is drained this long, so the
# client can read the answer before the close (aiohttp's default: 10 s per such connection).
LINGER_S = 2.0
DRAIN_TIMEOUT_S = 30.0  # SIGTERM: bound on in-flight requests (unit: TimeoutStopSec=45s)


@dataclass(slots=True)
class RunningAgent:
    """A started agent: its parts, the ports it listens on, and how to stop it."""

    registry: ModelRegistry
    dataplane: DataPlane
    http_port: int
    stack: contextlib.AsyncExitStack
    metrics_port: int | None = None
    model_cache: ModelCache | None = None
    grpc_port: int | None = None
    fleet: FleetLink | None = None
    tls: ServerTls | None = None  # reloaded on SIGHUP
    access: ApiAccess | None = None  # restricted API groups, swapped on SIGHUP

    async def stop(self) -> None:
        """Stop being ready, then stop every part in the reverse order of its start.

        The sync cycle in progress finishes (an install is never cut short), the fleet link
        publishes its retained "offline" status, the listeners let in-flight requests finish
        (within DRAIN_TIMEOUT_S), then the models are unloaded and the cache is closed.
        """
        self.dataplane.set_ready(False)
        await self.stack.aclose()
        logger.info("agent stopped")


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
    try:
        return await _start(config, stack)
    except BaseException:
        await stack.aclose()
        raise


async def _start(config: AgentConfig, stack: contextlib.AsyncExitStack) -> RunningAgent:
    raise_open_file_limit()
    for problem in exposure_problems(config.server):  # strict_security refused it at load
        logger.warning("security: %s", problem)
    access = ApiAccess(http_restrictions(config.server), grpc_restrictions(config.server))
    files = tls_files(config.server)
    tls = await asyncio.to_thread(ServerTls, files) if files is not None else None
    repo = config.models.repository
    model_cache: ModelCache | None = None
    if config.cache.dir is not None:
        model_cache = await asyncio.to_thread(_open_cache, config)
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
    logger.info("memory budget %d MiB (%s)", budget >> 20, source)
    stats = StatisticsRegistry()
    registry = ModelRegistry(
        repo,
        LoadSettings(
            auto_complete=not config.models.strict_model_config,
            intra_op_threads=config.models.intra_op_threads,
            max_queue_size=config.models.max_queue_size,
            engine_cache_root=config.cache.dir,
            max_request_bytes=config.server.max_request_bytes,
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
        _pushed_models(config, stack)
        if ModelControlMode(config.models.control_mode) is ModelControlMode.EXPLICIT
        else None
    )
    stack.push_async_callback(asyncio.to_thread, registry.close)
    mode = ModelControlMode(config.models.control_mode)
    events = EventTee(CacheEvents(model_cache) if model_cache is not None else LogEvents())
    manager = ModelManager(registry, events)
    if mode is ModelControlMode.POLL:
        # Started before the initial load so that no change in between is missed.
        watcher = RepositoryWatcher(
            repo,
            functools.partial(_reload, manager),
            on_removed=functools.partial(_unload_if_known, manager),
            quiet_s=config.models.poll_quiet_ms / 1000,
        )
        await watcher.start()
        stack.push_async_callback(watcher.stop)
    failures = await asyncio.to_thread(_initial_load, registry, mode, config.models.load_models)
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
        tracer=_tracer(config),
        server_name=config.server.name,
        private_paths=[config.cache.dir] if config.cache.dir is not None else [],
    )
    # Entered before the listeners: stopped after them, once no request can finish a trace.
    stack.push_async_callback(asyncio.to_thread, dataplane.tracer.close)
    sync = _build_sync(config, model_cache, versions, events)
    server = config.server
    limits = _connection_limits(config)
    found_gpu = await asyncio.to_thread(detect_gpu_reader)
    # One reading per interval (Triton's), shared by scrapes, telemetry and the status page.
    gpu = CachedGpuReader(found_gpu, time.monotonic, 2.0) if found_gpu is not None else None
    token = _status_token(server)
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
        body_timeout_s=limits.body_timeout_s,
        access=access if "http" in access.enforced else None,
        status=status,
        status_token=lambda: token,
    )
    context = tls.ssl_context if tls is not None else None
    port = await _serve_http(
        stack, app, server.host, server.http_port, limits, drain=True, ssl_context=context
    )
    grpc_port: int | None = None
    if config.server.grpc_port >= 0:
        grpc_server, grpc_port = await start_grpc_server(
            dataplane,
            config.server.host,
            config.server.grpc_port,
            max_message_bytes=config.server.max_request_bytes,
            tensor_limits=TensorLimits(server.max_request_bytes, server.max_bytes_elements),
            connection_limits=limits,
            access=access if "grpc" in access.enforced else None,
            tls=tls,
        )
        stack.push_async_callback(grpc_server.stop, DRAIN_TIMEOUT_S)
        logger.info("gRPC on %s:%d%s", config.server.host, grpc_port, _tls_note(tls))
    metrics_port: int | None = None
    if config.server.metrics_port >= 0:
        metrics_app = create_metrics_app(build_registry(stats, ledger, canary=canary, gpu=gpu))
        # The same TLS as the API (a scraper off loopback needs the client certificate too).
        metrics_port = await _serve_http(
            stack,
            metrics_app,
            server.host,
            server.metrics_port,
            limits,
            drain=False,
            ssl_context=context,
        )
        logger.info(
            "metrics on %s://%s:%d/metrics",
            "https" if tls else "http",
            config.server.host,
            metrics_port,
        )
    fleet: FleetLink | None = None
    if config.mqtt.enabled:
        fleet = await _start_fleet_link(
            stack, config, dataplane, registry, ledger, model_cache, sync, events, gpu
        )
    if sync is not None:
        # Last in, first out: on shutdown the cycle in progress finishes before anything else
        # stops (an install is never cut short).
        await _start_periodic_sync(stack, config, sync)
    dataplane.set_ready(True)
    served = ", ".join(sorted(m.name for m in registry.served_models())) or "none"
    logger.info(
        "listening on %s://%s:%d (models: %s)%s",
        "https" if tls else "http",
        config.server.host,
        port,
        served,
        _tls_note(tls),
    )
    return RunningAgent(
        registry,
        dataplane,
        port,
        stack,
        metrics_port=metrics_port,
        model_cache=model_cache,
        grpc_port=grpc_port,
        fleet=fleet,
        tls=tls,
        access=access,
    )


def _status_token(server: ServerConfig) -> str | None:
    """The token the status page needs: the configured one; none on loopback without one; an
    unguessable one beyond loopback without one (the page is then closed to everybody)."""
    if server.status_token:
        return server.status_token
    if is_loopback_host(server.host):
        return None
    logger.warning(
        "status page closed: server.host is beyond loopback and server.status_token is not set"
    )
    return secrets.token_urlsafe(32)


def _tls_note(tls: ServerTls | None) -> str:
    if tls is None:
        return ""
    return " over mutual TLS" if tls.mutual else " over TLS"


def _tracer(config: AgentConfig) -> Tracer:
    """The trace settings and output: the trace file, or in opentelemetry mode an OTLP/HTTP
    exporter (the opentelemetry packages are imported only then)."""
    log = config.log
    if log.trace_mode != "opentelemetry":
        return Tracer(str(log.trace_file or ""))
    from agent.serving.trace_otlp import (  # noqa: PLC0415 - opentelemetry only when configured
        DEFAULT_URL,
        OtlpExporter,
        parse_resource,
    )

    url = log.trace_otlp_url or DEFAULT_URL
    exporter = OtlpExporter(url, parse_resource(log.trace_otlp_resource))
    logger.info("traces: OpenTelemetry spans to %s", url)
    return Tracer(mode="opentelemetry", exporter=exporter)


def provenance_reader(config: AgentConfig, cache: ModelCache) -> ProvenanceOf:
    """Who signed a cached version, as the sync recorded it (also after `sync --once`)."""
    store = ProvenanceStore((config.sync.work_dir or Path(cache.root) / "sync") / "provenance")

    def read(model: str, version: int) -> dict[str, Any] | None:
        found = store.get(model, version)
        return found.to_json() if found is not None else None

    return read


@dataclass(frozen=True, slots=True)
class _Sync:
    """The signed sync of a running agent: one loop, shared by the schedule and the fleet."""

    client: SyncClient
    loop: SyncLoop


def _build_sync(
    config: AgentConfig,
    model_cache: ModelCache | None,
    versions: CachedVersions | None,
    events: EventTee,
) -> _Sync | None:
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
    return _Sync(client, loop)


async def _start_periodic_sync(
    stack: contextlib.AsyncExitStack, config: AgentConfig, sync: _Sync
) -> None:
    from sync.periodic import run_schedule  # noqa: PLC0415 - with build_client, above

    stop = asyncio.Event()
    task = asyncio.create_task(run_schedule(sync.loop, config.sync, stop))

    async def finish() -> None:
        stop.set()
        await task  # the cycle in progress completes

    stack.push_async_callback(finish)


def _connection_limits(config: AgentConfig) -> ConnectionLimits:
    server = config.server
    return ConnectionLimits(
        max_connections=server.max_connections,
        header_timeout_s=server.header_timeout_ms / 1000,
        idle_timeout_s=server.idle_timeout_ms / 1000,
        body_timeout_s=server.body_timeout_ms / 1000,
    )


async def _serve_http(
    stack: contextlib.AsyncExitStack,
    app: web.Application,
    host: str,
    port: int,
    limits: ConnectionLimits,
    *,
    drain: bool,
    ssl_context: ssl.SSLContext | None = None,
) -> int:
    """Listen on host:port (0: any free port) until the stack unwinds; returns the bound port.

    The listener is aiohttp's server behind a `ConnectionGuard` (connection cap and timeouts),
    which is why it is not a `web.TCPSite`: a site cannot take another protocol factory.
    """
    guard = ConnectionGuard(limits)
    app.middlewares.insert(0, guard.middleware())
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=DRAIN_TIMEOUT_S if drain else 1.0,
        keepalive_timeout=limits.idle_timeout_s,
        lingering_time=LINGER_S,
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    assert runner.server is not None  # set up
    guard.bind(runner.server)
    listener = await asyncio.get_running_loop().create_server(
        guard,
        host,
        port,
        reuse_address=True,
        backlog=1024,
        ssl=ssl_context,
        ssl_handshake_timeout=limits.header_timeout_s if ssl_context is not None else None,
    )
    # Unwound first: stop accepting, then the runner drains what is open (as a site's stop).
    stack.callback(listener.close)
    return int(listener.sockets[0].getsockname()[1])


async def _start_fleet_link(
    stack: contextlib.AsyncExitStack,
    config: AgentConfig,
    dataplane: DataPlane,
    registry: ModelRegistry,
    ledger: MemoryLedger,
    model_cache: ModelCache | None,
    sync: _Sync | None,
    events: EventTee,
    gpu: GpuReader | None,
) -> FleetLink:
    """Connect to the fleet manager's broker (returns at once; the broker may be away).

    Raises:
        AgentError: the link's state database or TLS files cannot be opened (what it had opened
            is closed again).
    """
    sync_now: Callable[[], Awaitable[dict[str, object]]] | None = None
    on_desired: Callable[[tuple[str, ...]], None] | None = None
    sync_state: Callable[[], Mapping[str, Any]] | None = None
    if sync is not None:
        loop = sync.loop

        async def run_sync_now() -> dict[str, object]:
            """The fleet's `sync`: one cycle of the same loop (its failures told once)."""
            result = await loop.cycle()
            if not result.ok or result.report is None:
                raise AgentError(f"sync failed: {result.error}")
            return {
                "installed": [list(p) for p in result.report.installed],
                "activated": [list(p) for p in result.activated],
                "rejected": [list(p) for p in result.rejected],
                "errors": [list(e) for e in result.report.errors],
            }

        sync_now = run_sync_now
        on_desired = functools.partial(_desired_from_fleet, sync.client, config.sync.desired)
        sync_state = loop.state
    state_dir = config.mqtt.state_dir or config.cache.dir or Path.home() / ".local/state/edge-agent"
    fleet = FleetLink(
        config.mqtt,
        dataplane,
        registry,
        ledger,
        state_dir / "fleet.sqlite",
        sync=sync_now,
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


def _desired_from_fleet(
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
        logger.info("stopping on signal")
        notifier.stopping("draining in-flight requests")
        loop.remove_signal_handler(signal.SIGHUP)
    return 0


def _pushed_models(config: AgentConfig, stack: contextlib.AsyncExitStack) -> PushedModels:
    """Where models loaded from request files live: in the cache directory when there is one
    (cleared at start-up, so nothing a crash left is kept), else a private temporary folder."""
    if config.cache.dir is not None:
        pushed = PushedModels(config.cache.dir / "pushed")
        stack.callback(pushed.close)
    else:
        pushed = PushedModels(Path(tempfile.mkdtemp(prefix="edge-agent-pushed-")))
        stack.callback(shutil.rmtree, pushed.root, ignore_errors=True)
    return pushed
