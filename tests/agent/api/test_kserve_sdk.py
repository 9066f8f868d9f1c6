"""KServe's Python SDK (the Open Inference Protocol's reference client) against the agent.

The SDK's dependencies conflict with the agent's (psutil<6 and others), so it lives in its own
venv (`make kserve-sdk` builds `.venv-kserve`; KSERVE_PYTHON names another interpreter) and
`tests/kserve_client.py` runs there as a subprocess against the agent started here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import VERSIONED_CONFIG, scale_model, write_model
from tests.server import running_agent

ROOT = Path(__file__).resolve().parents[3]
FACTOR = 3.0
NO_SDK = 3  # tests/kserve_client.py's exit status when it cannot import kserve


def kserve_python() -> str:
    """The interpreter that should have KServe's SDK, or skip the test saying how to get one."""
    path = Path(os.environ.get("KSERVE_PYTHON", "") or ROOT / ".venv-kserve" / "bin" / "python")
    if not path.is_file():
        pytest.skip(f"KServe's SDK is not installed ({path} missing: make kserve-sdk builds it)")
    return str(path)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("kserve") / "models"
    write_model(repo, "scale", scale_model(FACTOR), VERSIONED_CONFIG.format(name="scale"))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


def test_kserve_sdk_rest_and_grpc_pass_against_the_agent(agent: RunningAgent) -> None:
    python = kserve_python()
    result = subprocess.run(
        [
            python,
            str(ROOT / "tests" / "kserve_client.py"),
            f"http://127.0.0.1:{agent.http_port}",
            f"127.0.0.1:{agent.grpc_port}",
            "scale",
            str(FACTOR),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    output = result.stdout + result.stderr
    sys.stdout.write(output)
    if result.returncode == NO_SDK:
        pytest.skip(f"{python}: {output.strip()[-300:]} (make kserve-sdk builds it)")
    assert result.returncode == 0, output
    assert "all checks passed" in result.stdout, output
