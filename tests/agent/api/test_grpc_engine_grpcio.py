"""The grpc.aio engine (`server.grpc_engine = "grpcio"`) passes the same tritonclient tests.

The default engine is "loop"; grpcio stays selectable (the fallback an operator can turn to), so
Triton's gRPC client runs against it here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.choices import GrpcEngine
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.agent.api.test_grpc_tritonclient import *  # noqa: F403 - the same behaviours, grpcio engine
from tests.server import running_agent


@pytest.fixture(scope="module")
def agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            max_request_bytes=1 << 20,
            grpc_engine=GrpcEngine.GRPCIO,
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running
