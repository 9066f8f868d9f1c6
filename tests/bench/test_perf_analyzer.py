"""Triton's own load generator runs against the agent without errors (HTTP, binary tensors)."""

from __future__ import annotations

import pytest

from agent.runtime.daemon import RunningAgent
from tests.support import perf_analyzer_throughput


@pytest.mark.parametrize("model", ["mlp_classifier", "mixed_add"])
def test_perf_analyzer_concurrency_4_no_errors(agent: RunningAgent, model: str) -> None:
    throughput = perf_analyzer_throughput(
        "-m",
        model,
        "-u",
        f"127.0.0.1:{agent.http_port}",
        "-i",
        "http",
        "--concurrency-range",
        "4",
        "--measurement-interval",
        "1000",
        "-b",
        "1",
        "--input-tensor-format",
        "binary",
        "--output-tensor-format",
        "binary",
    )
    assert throughput > 0
