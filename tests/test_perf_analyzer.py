"""Triton's own load generator runs against the agent without errors (HTTP, binary tensors)."""

from __future__ import annotations

import re
import subprocess

import pytest

from agent.runtime.daemon import RunningAgent
from tests.support import PERF_ANALYZER_FIXED_WINDOWS, perf_analyzer


@pytest.mark.parametrize("model", ["mlp_classifier", "mixed_add"])
def test_perf_analyzer_concurrency_4_no_errors(agent: RunningAgent, model: str) -> None:
    result = subprocess.run(
        [
            perf_analyzer(),
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
            *PERF_ANALYZER_FIXED_WINDOWS,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    assert match is not None, output
    assert float(match.group(1)) > 0
    assert "error" not in output.lower(), output
