"""Machine description and markdown tables (the same text goes to the terminal and to --out)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort
import psutil

from agent import __version__ as agent_version
from bench.procs import MB, REPO_ROOT


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        # x86: "model name"; many ARM kernels (Jetson): "Model" or only "Hardware".
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def git_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' (modified)' if dirty else ''}"


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def machine_lines(perf_analyzer: str, load_at_start: float) -> list[str]:
    """Markdown bullet lines: date, machine, software versions, how busy the host was."""
    now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    ram_gib = psutil.virtual_memory().total / (1024**3)
    return [
        f"- date: {now}",
        f"- machine: {cpu_model()}, {usable_cores()} cores, {ram_gib:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"- software: Python {platform.python_version()}, onnxruntime {ort.__version__}, "
        f"edge-agent {agent_version} at {git_revision()}, {perf_analyzer}",
        f"- host load average (1 min): {load_at_start:.2f} at start, {load_average():.2f} at end "
        "(anything else running on these cores skews the numbers)",
    ]


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> str:
    """A padded markdown table; `right[i]` right-aligns column i."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if r else "-" * (w + 2)
            for w, r in zip(widths, right, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def fmt_rate(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def fmt_latencies(p50: float, p95: float, p99: float) -> str:
    return "/".join(f"{v:.0f}" for v in (p50, p95, p99))


def fmt_percent(ratio: float) -> str:
    return f"{ratio:.0%}" if ratio >= 0.1 else f"{ratio:.1%}"


def fmt_mb(value: int) -> str:
    return f"{value / MB:.1f}"
