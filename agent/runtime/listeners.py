"""The agent's listeners: the KServe HTTP and gRPC endpoints and the Prometheus /metrics one.

Each listener is entered into the start-up exit stack as it binds, so unwinding the stack stops
accepting first, then lets in-flight requests finish (within `DRAIN_TIMEOUT_S`). All three take
the same connection limits (cap, header/idle/body timeouts) and the same server TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from aiohttp import web

from agent.api.access import ApiAccess
from agent.api.grpc.aio import start_grpc_server
from agent.api.grpc.loop import start_loop_grpc_server
from agent.api.http.lane import INFER_LANE
from agent.api.http.limits import STOPPING, ConnectionGuard, ConnectionLimits
from agent.api.metrics import build_registry, create_metrics_app
from agent.api.tls import ServerTls
from agent.canary.control import CanaryManager
from agent.config.schema import AgentConfig
from agent.device.gpu import GpuReader
from agent.models.memory_plan import MemoryLedger
from agent.scheduling.statistics import StatisticsRegistry
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = [
    "DRAIN_TIMEOUT_S",
    "LINGER_S",
    "connection_limits",
    "serve_grpc",
    "serve_http",
    "serve_metrics",
    "tls_note",
]

logger = logging.getLogger(__name__)

# After an early answer (413, 408), the unread rest of a body is drained this long, so the
# client can read the answer before the close (aiohttp's default: 10 s per such connection).
LINGER_S = 2.0
DRAIN_TIMEOUT_S = 30.0  # SIGTERM: bound on in-flight requests (unit: TimeoutStopSec=45s)


def connection_limits(config: AgentConfig) -> ConnectionLimits:
    """The `[server]` connection cap and timeouts, shared by every listener."""
    server = config.server
    return ConnectionLimits(
        max_connections=server.max_connections,
        header_timeout_s=server.header_timeout_ms / 1000,
        idle_timeout_s=server.idle_timeout_ms / 1000,
        body_timeout_s=server.body_timeout_ms / 1000,
    )


def tls_note(tls: ServerTls | None) -> str:
    """What a "listening on" log line adds about TLS."""
    if tls is None:
        return ""
    return " over mutual TLS" if tls.mutual else " over TLS"


async def serve_http(
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

    The listener is aiohttp's server behind a `ConnectionGuard` (connection cap and timeouts,
    and the app's infer lane first on each connection: `agent.api.http.lane`), which is why it
    is not a `web.TCPSite`: a site cannot take another protocol factory.
    """
    guard = ConnectionGuard(limits, app.get(INFER_LANE))
    app.middlewares.insert(0, guard.middleware())
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=DRAIN_TIMEOUT_S if drain else 1.0,
        keepalive_timeout=limits.idle_timeout_s,
        lingering_time=LINGER_S,
        # A client that disconnects cancels its handler, so its inference request is cancelled
        # as in Triton (dropped while queued, `is_cancelled()` while running); model control
        # runs to completion regardless (the data plane shields it). Free on the fast path:
        # aiohttp only reads the flag when a connection is lost.
        handler_cancellation=True,
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    # Before aiohttp's shutdown, which knows nothing of the lane's requests in flight.
    stack.push_async_callback(guard.stop_lanes, DRAIN_TIMEOUT_S if drain else 1.0)
    if STOPPING in app:  # unwound before the cleanup: bodies still on their way are refused
        stack.callback(app[STOPPING].set)
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


async def serve_grpc(
    stack: contextlib.AsyncExitStack,
    config: AgentConfig,
    dataplane: DataPlane,
    limits: ConnectionLimits,
    access: ApiAccess,
    tls: ServerTls | None,
) -> int | None:
    """The KServe gRPC endpoint unless `server.grpc_port` is negative; returns its port."""
    server = config.server
    if server.grpc_port < 0:
        return None
    tensor_limits = TensorLimits(server.max_request_bytes, server.max_bytes_elements)
    restricted = access if "grpc" in access.enforced else None
    start = start_loop_grpc_server if server.grpc_engine == "loop" else start_grpc_server
    grpc_server, grpc_port = await start(
        dataplane,
        server.host,
        server.grpc_port,
        max_message_bytes=server.max_request_bytes,
        tensor_limits=tensor_limits,
        connection_limits=limits,
        access=restricted,
        tls=tls,
    )
    stack.push_async_callback(grpc_server.stop, DRAIN_TIMEOUT_S)
    logger.info(
        "gRPC on %s:%d%s (%s engine)", server.host, grpc_port, tls_note(tls), server.grpc_engine
    )
    return grpc_port


async def serve_metrics(
    stack: contextlib.AsyncExitStack,
    config: AgentConfig,
    limits: ConnectionLimits,
    tls: ServerTls | None,
    *,
    stats: StatisticsRegistry,
    ledger: MemoryLedger,
    canary: CanaryManager,
    gpu: GpuReader | None,
) -> int | None:
    """Prometheus /metrics unless `server.metrics_port` is negative; returns its port."""
    server = config.server
    if server.metrics_port < 0:
        return None
    metrics_app = create_metrics_app(build_registry(stats, ledger, canary=canary, gpu=gpu))
    # The same TLS as the API (a scraper off loopback needs the client certificate too).
    metrics_port = await serve_http(
        stack,
        metrics_app,
        server.host,
        server.metrics_port,
        limits,
        drain=False,
        ssl_context=tls.ssl_context if tls is not None else None,
    )
    logger.info(
        "metrics on %s://%s:%d/metrics", "https" if tls else "http", server.host, metrics_port
    )
    return metrics_port
