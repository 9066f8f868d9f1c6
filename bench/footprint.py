"""The agent's own footprint on a small board: idle memory, threads, import time, time to ready,
and (with --install) what `pip install '.[cpu]'` puts on the disk.

    python -m bench.footprint [--runs 5] [--install] [--json FILE]

Two agents, each started `--runs` times after one warm-up start (the page cache warm, the
bytecode written, the demo repository generated), as `python -m agent serve` with the default
ports (HTTP, loop gRPC, metrics) on free ports:

    demo        `serve --demo`, as `make run` starts it
    ten models  a repository of ten small MLPs (the demo's, FP32 [-1, 64] -> 32 -> 10), each
                with its own config.pbtxt and one instance

Per start: time to ready (from the spawn to the first 200 from /v2/health/ready), then, after
`--settle` seconds idle, RSS and USS (Private_Clean + Private_Dirty) from /proc/PID/smaps_rollup
and the thread count from /proc/PID/task. Medians are printed. Import time: `import
agent.cli.serve, agent.runtime.daemon` in a fresh interpreter (what `serve` imports before it
reads its config), the median of `--runs`.

Install size (--install, a few minutes): the tree is copied to a temporary folder, installed
with its `cpu` extra into a fresh venv made without pip, and the files of each distribution in
site-packages (their RECORD) are summed: the total, and the total beyond onnxruntime and numpy
(which JetPack brings on a Jetson) and pip. MB are 10^6 bytes; MiB 2^20.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.runtime.demo import mlp_model
from bench.procs import REPO_ROOT, stop_process

MIB = 1 << 20
MB = 1_000_000
NOT_OURS = ("onnxruntime", "numpy", "pip")  # JetPack's two, and the installer
TEN_MODELS_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


@dataclass(frozen=True, slots=True)
class Start:
    """One start of the agent, measured."""

    ready_s: float
    rss_mib: float
    uss_mib: float
    threads: int


@dataclass(frozen=True, slots=True)
class Row:
    """A scenario's medians over its starts."""

    scenario: str
    rss_mib: float
    uss_mib: float
    threads: int
    import_s: float
    ready_s: float
    starts: int


def write_ten_models(root: Path) -> Path:
    """Ten small MLPs, `mlp_0` .. `mlp_9`, each with its config; returns the repository."""
    repo = root / "ten-models"
    for i in range(10):
        name = f"mlp_{i}"
        (repo / name / "1").mkdir(parents=True)
        model = mlp_model(hidden=32, seed=i)
        (repo / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
        (repo / name / "config.pbtxt").write_text(TEN_MODELS_CONFIG.format(name=name))
    return repo


def child_env(cache_home: Path) -> dict[str, str]:
    """The agent's environment: bytecode written as an installed package has it, the demo in a
    cache folder of the bench's own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_CACHE_HOME"] = str(cache_home)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _smaps_rollup(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields


def measure_start(args: Sequence[str], env: dict[str, str], settle_s: float) -> Start:
    """Start `python -m agent serve ARGS` on free ports; time to ready, then idle figures."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "agent",
        "serve",
        *args,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--grpc-port",
        str(_free_port()),
        "--metrics-port",
        str(_free_port()),
    ]
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {proc.returncode}: {proc.stderr}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - started > 120:
                raise RuntimeError("the agent was not ready within 120 s")
            time.sleep(0.005)
        ready_s = time.monotonic() - started
        time.sleep(settle_s)
        rollup = _smaps_rollup(proc.pid)
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    finally:
        stop_process(proc, grace_s=20)
        if proc.stderr is not None:
            proc.stderr.close()
    uss = rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)
    return Start(ready_s, rollup["Rss"] / MIB, uss / MIB, threads)


def import_seconds(env: dict[str, str]) -> float:
    """`import agent.cli.serve, agent.runtime.daemon` in a fresh interpreter, in seconds."""
    code = (
        "import time; t = time.perf_counter()\n"
        "import agent.cli.serve, agent.runtime.daemon\n"
        "print(time.perf_counter() - t)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip())


def scenario(
    name: str, args: Sequence[str], env: dict[str, str], runs: int, settle_s: float
) -> Row:
    """One warm-up start, then `runs` measured ones; their medians."""
    measure_start(args, env, 0.0)
    import_seconds(env)
    starts = [measure_start(args, env, settle_s) for _ in range(runs)]
    imports = [import_seconds(env) for _ in range(runs)]
    return Row(
        scenario=name,
        rss_mib=statistics.median(s.rss_mib for s in starts),
        uss_mib=statistics.median(s.uss_mib for s in starts),
        threads=int(statistics.median(s.threads for s in starts)),
        import_s=statistics.median(imports),
        ready_s=statistics.median(s.ready_s for s in starts),
        starts=runs,
    )


def dist_sizes(site_packages: Path) -> dict[str, int]:
    """Bytes per distribution installed in `site_packages` (the files its RECORD lists)."""
    sizes: dict[str, int] = {}
    for record in site_packages.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0].lower().replace("_", "-")
        total = 0
        with record.open(newline="", encoding="utf-8") as rows:
            for row in csv.reader(rows):
                path = site_packages / row[0]
                if row and path.is_file():
                    total += path.stat().st_size
        sizes[name] = total
    return sizes


def install_sizes(work: Path, extra: str) -> dict[str, int]:
    """`pip install 'TREE[extra]'` into a fresh venv (without pip) → bytes per distribution."""
    source = work / "src"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "__pycache__", "*.egg-info", "build", ".mypy_cache", ".ruff_cache"
        ),
    )
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", f"{source}[{extra}]"], check=True)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return dist_sizes(Path(purelib))


def print_install(sizes: dict[str, int], extra: str, out: list[str]) -> dict[str, object]:
    ours = {k: v for k, v in sizes.items() if k not in NOT_OURS}
    total = sum(sizes.values())
    beyond = sum(ours.values())
    out.append(f"\npip install '.[{extra}]': {len(sizes)} distributions, {total / MB:.1f} MB")
    out.append(f"beyond {', '.join(NOT_OURS)}: {beyond / MB:.1f} MB in {len(ours)} distributions")
    for name, size in sorted(ours.items(), key=lambda kv: -kv[1])[:15]:
        out.append(f"  {size / MB:6.1f} MB  {name}")
    return {"total_mb": total / MB, "beyond_mb": beyond / MB, "distributions": sizes}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="measured starts per scenario")
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before reading")
    parser.add_argument("--install", action="store_true", help="also measure the install size")
    parser.add_argument("--extra", default="cpu", help="the extra to install (default cpu)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        work = Path(tmp)
        env = child_env(work / "cache")
        ten = write_ten_models(work)
        rows = [
            scenario("demo", ["--demo"], env, args.runs, args.settle),
            scenario("ten models", ["--model-repository", str(ten)], env, args.runs, args.settle),
        ]
        out = [
            f"{'scenario':<12} {'RSS MiB':>8} {'USS MiB':>8} {'threads':>8} "
            f"{'import s':>9} {'ready s':>8}",
        ]
        out += [
            f"{r.scenario:<12} {r.rss_mib:8.1f} {r.uss_mib:8.1f} {r.threads:8d} "
            f"{r.import_s:9.2f} {r.ready_s:8.2f}"
            for r in rows
        ]
        doc: dict[str, object] = {"rows": [asdict(r) for r in rows]}
        if args.install:
            doc["install"] = print_install(install_sizes(work, args.extra), args.extra, out)
    print("\n".join(out))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
