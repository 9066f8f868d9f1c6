"""Both servers on one repository, once per module: the real tritonserver and the agent.

Each test module of this folder asks for `pair` (module-scoped): Triton and the agent started on
the same freshly written repository (tests/conformance/repository.py), in explicit model control
with every model loaded at start, as `--model-control-mode=explicit --load-model=*` does.
`started_pair(workdir, writer, mode)` starts such a pair on another repository (a writer of
model folders) or in poll mode (Triton polls every second). Without Triton (`make triton`
installs it) the tests skip and say why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    return Side(name, http_port, channel, metrics_port, grpc_port)


# Triton's flags for each mode the pairs run in: explicit loads every model at start.
_TRITON_MODE = {
    ModelControlMode.EXPLICIT: ("--model-control-mode=explicit", "--load-model=*"),
    ModelControlMode.POLL: ("--model-control-mode=poll", "--repository-poll-secs=1"),
}


@contextmanager
def _no_bytecode() -> Iterator[None]:
    """Python workers (the agent's, Triton's stubs) write no __pycache__ beside model.py: in
    poll mode that folder is a change, and Triton would reload each model once more after it
    loads it, racing the test's next change."""
    before = os.environ.get("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONDONTWRITEBYTECODE"]
        else:
            os.environ["PYTHONDONTWRITEBYTECODE"] = before


@contextmanager
def started_pair(
    work: Path,
    writer: Callable[[Path], Path] = write_repository,
    mode: ModelControlMode = ModelControlMode.EXPLICIT,
) -> Iterator[Pair]:
    """Triton and the agent on the repository `writer` makes under `work`, in `mode`.

    Skips (pytest.skip) when Triton is not installed."""
    install = find_triton()
    if isinstance(install, str):
        pytest.skip(f"the real tritonserver is not available: {install}")
    repo = writer(work / "models")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0, name="triton"),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=mode,
            load_models=("*",) if mode is ModelControlMode.EXPLICIT else (),
            poll_quiet_ms=200,
        ),
    )
    flags = _TRITON_MODE[mode]
    with (
        _no_bytecode(),
        running_triton(install, repo, work, *flags) as triton,
        running_agent(config) as agent,
    ):
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


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with started_pair(tmp_path_factory.mktemp("conformance")) as started:
        yield started
