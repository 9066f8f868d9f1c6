"""Start-up that fails half way stops, in reverse order, every part it had started.

Each scenario makes one part fail after others are up (a port in use, a fleet link whose state
database cannot be opened) and then checks what the failed start leaves behind: no listening
port, no running task, no repository watcher, no inference threads, and a model cache whose lock
another process could take.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from watchdog.observers.api import BaseObserver

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.errors import AgentError
from agent.fleet.config import MqttConfig
from agent.runtime.daemon import start_agent
from agent.runtime.demo import mlp_model
from model_cache import ModelCache
from sync.config import SyncConfig
from sync.keys import init_keys
from tests.models import write_model
from tests.support import free_port


def _distinct_free_ports(count: int) -> list[int]:
    """Ports nothing listens on, all different (held together while they are picked)."""
    holders = [socket.socket() for _ in range(count)]
    try:
        for holder in holders:
            holder.bind(("127.0.0.1", 0))
        return [int(h.getsockname()[1]) for h in holders]
    finally:
        for holder in holders:
            holder.close()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _start_fails(config: AgentConfig, error: type[BaseException], match: str) -> None:
    async def scenario() -> None:
        with pytest.raises(error, match=match):
            await start_agent(config)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == [], others  # no sync task, fleet loop or server task left running

    asyncio.run(scenario())


def _assert_released(*ports: int, cache_dir: Path | None = None) -> None:
    for port in ports:
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))  # OSError if the agent still listened on it
    threads = threading.enumerate()
    assert not [t.name for t in threads if t.name.startswith("infer-")]  # models unloaded
    assert not [t for t in threads if isinstance(t, BaseObserver)]  # watcher stopped
    if cache_dir is not None:
        ModelCache(cache_dir, verify_on_open=False).close()  # its exclusive lock is free


def test_a_port_in_use_after_http_and_the_watcher_started(tmp_path: Path, busy_port: int) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "m", mlp_model())
    http = free_port()
    config = AgentConfig(
        server=ServerConfig(http_port=http, grpc_port=busy_port, metrics_port=-1),
        models=ModelsConfig(repository=repo, control_mode=ModelControlMode.POLL),
    )
    _start_fails(config, OSError, str(busy_port))
    _assert_released(http)


def test_a_fleet_link_that_cannot_open_its_database_undoes_the_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    init_keys(keys, {})
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file where the link's state folder should be")
    http, grpc, metrics, broker = _distinct_free_ports(4)
    config = AgentConfig(
        server=ServerConfig(http_port=http, grpc_port=grpc, metrics_port=metrics),
        cache=CacheConfig(dir=tmp_path / "cache"),
        sync=SyncConfig(
            source=(tmp_path / "store").as_uri(),
            trusted_root=keys / "metadata" / "root.json",
            interval_s=3600,
        ),
        mqtt=MqttConfig(host="127.0.0.1", port=broker, state_dir=not_a_folder),
    )
    _start_fails(config, AgentError, "fleet link")
    _assert_released(http, grpc, metrics, cache_dir=tmp_path / "cache")
