from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import build_test_repository
from tests.server import running_agent


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=1 << 20),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def url(agent: RunningAgent) -> str:
    return f"127.0.0.1:{agent.http_port}"
