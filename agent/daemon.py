"""Composition root: build the registry, data plane and HTTP server; run until SIGTERM/SIGINT.

Shutdown order: stop being ready, close the listener and finish in-flight requests, unload models.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from aiohttp import web

from agent.config import AgentConfig
from agent.dataplane import DataPlane
from agent.demo import default_demo_dir, write_demo_repository
from agent.errors import ModelLoadError
from agent.http import create_app
from agent.registry import LoadSettings, ModelRegistry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RunningAgent:
    """A started agent: its parts and the port it listens on."""

    registry: ModelRegistry
    dataplane: DataPlane
    runner: web.AppRunner
    http_port: int

    async def stop(self) -> None:
        """Stop accepting work, let in-flight requests finish, unload models."""
        self.dataplane.set_ready(False)
        await self.runner.cleanup()
        await asyncio.to_thread(self.registry.close)
        logger.info("agent stopped")


async def start_agent(config: AgentConfig) -> RunningAgent:
    """Load the repository and start listening.

    Raises:
        ModelLoadError: with exit_on_error, a model failed to load (the message names each one).
        OSError: the HTTP port cannot be bound.
    """
    repo = config.models.repository
    if repo is None:
        repo = await asyncio.to_thread(write_demo_repository, default_demo_dir())
        logger.info("serving the demo repository at %s", repo)
    registry = ModelRegistry(
        repo,
        LoadSettings(
            auto_complete=not config.models.strict_model_config,
            intra_op_threads=config.models.intra_op_threads,
        ),
    )
    failures = await asyncio.to_thread(registry.load_all)
    if failures and config.models.exit_on_error:
        await asyncio.to_thread(registry.close)
        detail = "; ".join(f"{name}: {reason}" for name, reason in sorted(failures.items()))
        raise ModelLoadError(f"failed to load {len(failures)} model(s): {detail}")
    dataplane = DataPlane(registry)
    app = create_app(dataplane, max_request_bytes=config.server.max_request_bytes)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.http_port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        await asyncio.to_thread(registry.close)
        raise
    port = int(runner.addresses[0][1])
    dataplane.set_ready(True)
    served = ", ".join(sorted(m.name for m in registry.served_models())) or "none"
    logger.info("listening on http://%s:%d (models: %s)", config.server.host, port, served)
    return RunningAgent(registry, dataplane, runner, port)


async def run_agent(config: AgentConfig) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    agent = await start_agent(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("stopping on signal")
    await agent.stop()
    return 0
