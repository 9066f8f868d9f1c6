"""The agent's listeners: the KServe HTTP and gRPC endpoints and the Prometheus /metrics one,
started one by one and stopped together within the stop budget (`agent.runtime.shutdown`).

`Listeners` is entered into the start-up exit stack before the first one binds, so a start-up
that fails half way stops those it started; `RunningAgent.stop` stops them first of all. The
stop: every listener stops accepting and each HTTP policy learns the stop began (bodies still
arriving are refused at once), then all drain at the same time until the budget's drain
deadline: the infer lanes' and aiohttp's requests, the gRPC calls. What still runs at the
deadline is cancelled (within `CANCEL_S`). All three take the same connection limits (cap,
header/idle/body timeouts) and the same server TLS.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from agent.api.access import ApiAccess
from agent.api.grpc.loop import start_loop_grpc_server
from agent.api.http.connection import CONNECTION_GUARD, ConnectionGuard
from agent.api.http.limits import ConnectionLimits
from agent.api.http.policy import HTTP_POLICY, HttpPolicy
from agent.api.metrics import build_registry, create_metrics_app
from agent.api.tls import ServerTls
from agent.canary.control import CanaryManager
from agent.config.choices import GrpcEngine
from agent.config.schema import AgentConfig
from agent.device.gpu import GpuReader
from agent.models.memory_plan import MemoryLedger
from agent.runtime.shutdown import StopBudget
from agent.scheduling.statistics import StatisticsRegistry
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = [
    "CANCEL_S",
    "LINGER_S",
    "Listeners",
    "connection_limits",
    "tls_note",
]

logger = logging.getLogger(__name__)

# After an early answer (413, 408), the unread rest of a body is drained this long, so the
# client can read the answer before the close (aiohttp's default: 10 s per such connection).
LINGER_S = 2.0
# Past the drain deadline, a cancelled aiohttp handler gets this long to end (twice: aiohttp
# waits once before it cancels, once after).
CANCEL_S = 0.5
METRICS_DRAIN_S = 1.0  # a scrape in flight at the stop (nobody waits for the last one)


def connection_limits(config: AgentConfig) -> ConnectionLimits:
    """The `[server]` connection cap and timeouts, shared by every listener."""
    server = config.server
    return ConnectionLimits(
        max_connections=server.max_connections,
        header_timeout_s=server.header_timeout_ms / 1000,
        idle_timeout_s=server.idle_timeout_ms / 1000,
        body_timeout_s=server.body_timeout_ms / 1000,
        send_timeout_s=server.send_timeout_ms / 1000,
    )


def tls_note(tls: ServerTls | None) -> str:
    """What a "listening on" log line adds about TLS."""
    if tls is None:
        return ""
    return " over mutual TLS" if tls.mutual else " over TLS"


class _GrpcServer(Protocol):
    """Either gRPC engine's server: `stop` stops accepting, then waits `grace` for calls."""

    async def stop(self, grace: float | None) -> None: ...


# Either engine's start function (the same arguments; its server and bound port).
_StartGrpc = Callable[..., Awaitable[tuple[_GrpcServer, int]]]


@dataclass(slots=True)
class _HttpListener:
    listener: asyncio.Server
    runner: web.AppRunner
    guard: ConnectionGuard
    policy: HttpPolicy | None
    waited_for: bool  # False: nobody waits for it (metrics): it drains METRICS_DRAIN_S at most

    def close(self) -> None:
        """Stop accepting and refuse what can no longer complete: the policy's stop (bodies
        still arriving: 503), the lanes' stop, no new request on aiohttp's connections."""
        self.listener.close()
        if self.policy is not None:
            self.policy.begin_stop()
        self.guard.stop_lanes()
        server = self.runner.server
        if server is not None:
            for handler in server.connections:
                handler.close()  # the request in progress completes, then the connection ends

    async def drain(self, budget: StopBudget) -> None:
        left = budget.drain_left()
        still = await self.guard.wait_idle(left if self.waited_for else min(METRICS_DRAIN_S, left))
        if still:
            logger.warning("HTTP: %d request(s) running at the drain deadline: cancelled", still)
        server = self.runner.server
        if server is not None:
            await server.shutdown(CANCEL_S)  # idle ones close at once, late handlers are cancelled
        self.guard.close_all()  # the lanes' late requests
        await self.runner.cleanup()


class Listeners:
    """The agent's listeners (see the module doc); `stop` is idempotent."""

    def __init__(self, budget: StopBudget) -> None:
        self._budget = budget
        self._http: list[_HttpListener] = []
        self._grpc: list[_GrpcServer] = []
        self._stopped = False

    async def serve_http(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        waited_for: bool,
        ssl_context: ssl.SSLContext | None = None,
    ) -> int:
        """Listen on host:port (0: any free port) until `stop`; returns the bound port.

        The app comes whole from its factory, with its connection guard (`CONNECTION_GUARD`:
        the connection cap and timeouts, and the app's infer lane first on each connection),
        which is the listening socket's protocol factory: why this is not a `web.TCPSite`, which
        cannot take another. `waited_for`: its in-flight requests are drained at the stop until the
        drain deadline (False: a second at most).
        """
        guard = app[CONNECTION_GUARD]
        limits = guard.limits
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=CANCEL_S,  # by then `stop` has drained it
            keepalive_timeout=limits.idle_timeout_s,
            lingering_time=LINGER_S,
            # A client that disconnects cancels its handler, so its inference request is
            # cancelled as in Triton (dropped while queued, `is_cancelled()` while running);
            # model control runs to completion regardless (the data plane shields it). Free on
            # the fast path: aiohttp only reads the flag when a connection is lost.
            handler_cancellation=True,
        )
        await runner.setup()
        assert runner.server is not None  # set up
        guard.bind(runner.server)
        try:
            listener = await asyncio.get_running_loop().create_server(
                guard,
                host,
                port,
                reuse_address=True,
                backlog=1024,
                ssl=ssl_context,
                ssl_handshake_timeout=limits.header_timeout_s if ssl_context is not None else None,
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._http.append(_HttpListener(listener, runner, guard, app.get(HTTP_POLICY), waited_for))
        return int(listener.sockets[0].getsockname()[1])

    async def serve_grpc(
        self,
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
        if server.grpc_engine is GrpcEngine.LOOP:
            start: _StartGrpc = start_loop_grpc_server
        else:
            # grpcio (the [grpcio] extra) is imported for its engine only.
            from agent.api.grpc.aio import start_grpc_server  # noqa: PLC0415

            start = start_grpc_server
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
        self._grpc.append(grpc_server)
        logger.info(
            "gRPC on %s:%d%s (%s engine)", server.host, grpc_port, tls_note(tls), server.grpc_engine
        )
        return grpc_port

    async def serve_metrics(
        self,
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
        metrics_app = create_metrics_app(
            build_registry(stats, ledger, canary=canary, gpu=gpu), limits
        )
        # The same TLS as the API (a scraper off loopback needs the client certificate too).
        metrics_port = await self.serve_http(
            metrics_app,
            server.host,
            server.metrics_port,
            waited_for=False,
            ssl_context=tls.ssl_context if tls is not None else None,
        )
        logger.info(
            "metrics on %s://%s:%d/metrics", "https" if tls else "http", server.host, metrics_port
        )
        return metrics_port

    async def stop(self) -> None:
        """Stop every listener within the budget's drain deadline (see the module doc)."""
        if self._stopped:
            return
        self._stopped = True
        self._budget.begin()
        for http in self._http:
            http.close()
        grace = self._budget.drain_left()
        results = await asyncio.gather(
            *(http.drain(self._budget) for http in self._http),
            *(grpc.stop(grace) for grpc in self._grpc),
            return_exceptions=True,
        )
        logger.info("listeners stopped %.1f s into the stop", self._budget.elapsed())
        for result in results:
            if isinstance(result, BaseException):
                raise result
