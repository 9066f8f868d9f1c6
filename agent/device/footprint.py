"""The agent's own footprint, for `edge-agent doctor`: what its install holds, what `serve`
imports, and what a running agent uses (RSS, USS, threads, its compiled packages).

Facts only, as plain dicts (`agent.device.checks.footprint_checks` judges them):

    install_facts(extras)   the edge-agent distribution and what it requires (the extras that
                            are installed included), summed from each distribution's RECORD
    import_facts()          a fresh interpreter imports what `serve` imports before it reads
                            its config: seconds, RSS, the packages outside the standard library
    running_facts()         each `edge-agent serve` / `python -m agent serve` process this user
                            can read: RSS and USS (/proc/PID/smaps_rollup), threads, and the
                            packages whose compiled modules it has mapped (/proc/PID/maps: what
                            it imported beyond pure Python)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

__all__ = ["NOT_OURS", "import_facts", "install_facts", "running_facts"]

# JetPack brings these two on a Jetson; the figures also say what is beyond them.
NOT_OURS = ("onnxruntime", "onnxruntime-gpu", "numpy")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_SITE = re.compile(r"/(?:site|dist)-packages/([A-Za-z0-9_]+)[/.]")
_IMPORT_PROBE = """
import json, sys, time
t = time.perf_counter()
import agent.cli.serve, agent.runtime.daemon
seconds = time.perf_counter() - t
rss = 0
with open("/proc/self/status", encoding="ascii") as status:
    for line in status:
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
names = {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
names -= set(sys.stdlib_module_names)
print(json.dumps({"seconds": seconds, "rss_bytes": rss,
                  "packages": sorted(n for n in names if not n.startswith("_"))}))
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_bytes(dist: metadata.Distribution) -> int:
    total = 0
    for file in dist.files or ():
        try:
            total += os.path.getsize(str(dist.locate_file(file)))
        except OSError:
            continue
    return total


def install_facts(extras: Iterable[str]) -> dict[str, Any]:
    """The edge-agent distribution and everything it requires that is installed (the `extras`
    named included): bytes per distribution, and the total beyond `NOT_OURS`."""
    wanted = set(extras)
    try:
        root = metadata.distribution("edge-agent")
    except metadata.PackageNotFoundError:
        return {"error": "the edge-agent distribution is not installed (running from a tree?)"}
    sizes: dict[str, int] = {}
    todo: list[tuple[metadata.Distribution, set[str]]] = [(root, wanted)]
    while todo:
        dist, selected = todo.pop()
        name = _canonical(dist.metadata["Name"])
        if name in sizes:
            continue
        sizes[name] = _dist_bytes(dist)
        for requirement in dist.requires or ():
            spec, _, marker = requirement.partition(";")
            extra = _EXTRA.search(marker)
            if extra is not None and extra.group(1) not in selected:
                continue
            match = _NAME.match(spec)
            if match is None:
                continue
            inner = re.search(r"\[([^\]]+)\]", spec)
            try:
                found = metadata.distribution(match.group(1))
            except metadata.PackageNotFoundError:
                continue  # a marker that does not apply here, or an extra not installed
            nested = {e.strip() for e in inner.group(1).split(",")} if inner else set()
            todo.append((found, nested))
    beyond = {k: v for k, v in sizes.items() if k not in NOT_OURS}
    return {
        "bytes": sum(sizes.values()),
        "beyond_runtime_bytes": sum(beyond.values()),
        "distributions": len(sizes),
        "largest": sorted(beyond.items(), key=lambda kv: -kv[1])[:5],
    }


def import_facts(timeout_s: float = 60.0) -> dict[str, Any]:
    """What `serve` imports before it reads its config, in a fresh interpreter."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    facts: dict[str, Any] = json.loads(done.stdout)
    return facts


def running_facts(proc_root: Path = Path("/proc")) -> list[dict[str, Any]]:
    """Each running agent (`serve`) this user can read, with its memory, threads and the
    packages whose compiled modules it has mapped."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if not _is_agent(cmdline) or process.info["pid"] == os.getpid():
            continue
        pid = int(process.info["pid"])
        try:
            rollup = _rollup(proc_root / str(pid) / "smaps_rollup")
            threads = len(os.listdir(proc_root / str(pid) / "task"))
            native = _native_packages((proc_root / str(pid) / "maps").read_text("ascii"))
        except (OSError, ValueError):
            continue  # gone, or another user's
        found.append(
            {
                "pid": pid,
                "rss_bytes": rollup.get("Rss", 0),
                "uss_bytes": rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0),
                "threads": threads,
                "native_packages": native,
            }
        )
    return found


def _is_agent(cmdline: list[str]) -> bool:
    """`edge-agent serve ...` or `python -m agent serve ...`."""
    if "serve" not in cmdline:
        return False
    head = cmdline[: cmdline.index("serve")]
    return any(Path(part).name == "edge-agent" for part in head) or (
        "-m" in head and "agent" in head
    )


def _rollup(path: Path) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in path.read_text("ascii").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields


def _native_packages(maps: str) -> list[str]:
    """Top-level packages under site-packages with a shared object mapped (`.so` files)."""
    names = set()
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if ".so" not in path:
            continue
        match = _SITE.search(path)
        if match is not None:
            names.add(match.group(1))
    return sorted(names)
