"""`python -m bench.cpu_per_request` measures the agent and the aiohttp floor side by side."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import perf_analyzer

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cpu_per_request_reports_every_server_and_concurrency() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cpu_per_request",
            "--servers",
            "floor,nobatch,nobatch-grpc,nobatch-grpcio",
            "--concurrency",
            "1,2",
            "--requests",
            "300",
            "--perf-analyzer",
            perf_analyzer(),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,  # a hung perf_analyzer run is cut off and made again (bench.cpu_per_request)
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(
        r"^\| (floor|nobatch|nobatch-grpc|nobatch-grpcio) +\| +(\d+) \| +300 \| +(\d+) \|",
        result.stdout,
        re.M,
    )
    assert [(server, conc) for server, conc, _ in rows] == [
        ("floor", "1"),
        ("floor", "2"),
        ("nobatch", "1"),
        ("nobatch", "2"),
        ("nobatch-grpc", "1"),
        ("nobatch-grpc", "2"),
        ("nobatch-grpcio", "1"),
        ("nobatch-grpcio", "2"),
    ]
    assert all(int(cpu) > 0 for _, _, cpu in rows)
