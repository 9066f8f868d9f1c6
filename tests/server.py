"""Run a real agent in a background thread (its own event loop) for end-to-end tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agent.config.schema import AgentConfig
from agent.runtime.daemon import RunningAgent, start_agent


@contextmanager
def running_agent(config: AgentConfig) -> Iterator[RunningAgent]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    agent = asyncio.run_coroutine_threadsafe(start_agent(config), loop).result(timeout=120)
    try:
        yield agent
    finally:
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
