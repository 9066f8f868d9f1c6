"""Both servers on one repository, once per module: the real tritonserver and the agent.

Each test module of this folder asks for `pair` (module-scoped): Triton and the agent started on
the same freshly written repository (tests/conformance/repository.py), in explicit model control
with every model loaded at start, as `--model-control-mode=explicit --load-model=*` does.
Without Triton (`make triton` installs it) the tests skip and say why.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from tests.conformance.compare import Side
from tests.conformance.repository import write_repository
from tests.conformance.triton import find_triton, running_triton
from tests.server import running_agent


@dataclass(frozen=True, slots=True)
class Pair:
    triton: Side
    agent: Side
    repo: Path


def _side(name: str, http_port: int, grpc_port: int, metrics_port: int) -> Side:
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    return Side(name, http_port, channel, metrics_port)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    install = find_triton()
    if isinstance(install, str):
        pytest.skip(f"the real tritonserver is not available: {install}")
    work = tmp_path_factory.mktemp("conformance")
    repo = write_repository(work / "models")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0, name="triton"),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    explicit = ("--model-control-mode=explicit", "--load-model=*")
    with running_triton(install, repo, work, *explicit) as triton, running_agent(config) as agent:
        assert agent.grpc_port is not None
        assert agent.metrics_port is not None
        sides = (
            _side("triton", triton.http_port, triton.grpc_port, triton.metrics_port),
            _side("agent", agent.http_port, agent.grpc_port, agent.metrics_port),
        )
        try:
            yield Pair(sides[0], sides[1], repo)
        finally:
            for side in sides:
                side.channel.close()
