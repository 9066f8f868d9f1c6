"""Run a real agent in a background thread (its own event loop) for end-to-end tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent, start_agent

T = TypeVar("T")


class AgentOnThread:
    """A started agent and the event loop it runs on (in a background thread)."""

    def __init__(self, agent: RunningAgent, loop: asyncio.AbstractEventLoop) -> None:
        self.agent = agent
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the agent's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextmanager
def agent_on_thread(config: AgentConfig) -> Iterator[AgentOnThread]:
    """Start the agent exactly as the daemon wires it; stop it on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    agent = asyncio.run_coroutine_threadsafe(start_agent(config), loop).result(timeout=120)
    try:
        yield AgentOnThread(agent, loop)
    finally:
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextmanager
def running_agent(config: AgentConfig) -> Iterator[RunningAgent]:
    with agent_on_thread(config) as running:
        yield running.agent


@contextmanager
def explicit_agent(repo: Path, *, metrics_port: int = -1) -> Iterator[RunningAgent]:
    """An agent loading every model of `repo` in explicit mode, one thread each, on free ports."""
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=metrics_port),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    with running_agent(config) as agent:
        yield agent


@contextmanager
def http_client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient over HTTP to `agent`, closed afterwards."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}", network_timeout=60)
    try:
        yield client
    finally:
        client.close()


def failure_reason(client: httpclient.InferenceServerClient, name: str) -> str:
    """Why a model does not serve: its index rows' reasons when a version failed, else (its
    config failed: the index gives the name alone, as Triton's) its metadata error's text."""
    rows = [r for r in client.get_model_repository_index() if r["name"] == name]
    reasons = [str(r["reason"]) for r in rows if r.get("reason")]
    if reasons:
        return "; ".join(reasons)
    try:
        client.get_model_metadata(name)
    except InferenceServerException as exc:
        return str(exc.message())
    return ""
