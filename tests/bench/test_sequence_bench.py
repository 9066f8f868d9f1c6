"""`python -m bench.sequence_bench`: perf_analyzer's `--sequence-length` load against a
stateful model runs without errors, beside the stateless baseline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import perf_analyzer

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_sequence_bench_reports_the_baseline_and_a_strategy() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.sequence_bench",
            "--servers",
            "stateless,oldest",
            "--concurrency",
            "4",
            "--requests",
            "200",
            "--perf-analyzer",
            perf_analyzer(),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (stateless|oldest) +\| +4 \| +200 \| +(\d+) \|", result.stdout, re.M)
    assert [server for server, _ in rows] == ["stateless", "oldest"]
    assert all(int(cpu) > 0 for _, cpu in rows)
