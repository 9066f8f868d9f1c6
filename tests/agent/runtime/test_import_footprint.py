"""A serving agent does not load what only other commands or other configs need (memory on a
small device), and `serve --demo` works with none of the optional extras installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

# What each costs in RSS on the development machine: boto3 + python-tuf + cryptography ~26 MiB
# (only with [sync]), onnx ~11 MiB (only for quantize), opentelemetry (only with trace_mode =
# "opentelemetry"), grpcio ~10 MiB (only the grpcio engine), cryptography ~8 MiB (signatures,
# TLS keys), the cache's SQLite layer (only with cache.dir), paho (only with [mqtt]).
HEAVY = ("boto3", "botocore", "tuf", "securesystemslib", "onnx", "sklearn", "opentelemetry")
# The optional extras (pyproject.toml): blocked for the whole process tree of the test below.
EXTRAS = ("boto3", "botocore", "opentelemetry", "grpc", "model_signing", "OpenSSL", "onnx")
NOT_FOR_A_PLAIN_SERVE = (
    *HEAVY,
    *EXTRAS,
    "cryptography",
    "sqlite_utils",
    "paho",
    "watchdog",
    "urllib3",
    "sigstore",
    "grpc_tools",
)

# Runs `edge-agent serve` as the CLI does, prints the top-level packages once it is ready, and
# stops itself with SIGTERM (the agent's own shutdown path).
_SERVE_AND_REPORT = """
import json, os, signal, socket, sys, threading, time, urllib.request
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
def report():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                break
        except OSError:
            time.sleep(0.05)
    print(json.dumps(sorted({m.split(".")[0] for m, v in sys.modules.items() if v})), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=report, daemon=True).start()
import agent.cli
sys.exit(agent.cli.main(["serve", "--demo", "--http-port", str(port), "--grpc-port", "0",
                         "--metrics-port", "0", "--intra-op-threads", "1"]))
"""


@pytest.mark.e2e
def test_serve_demo_imports_no_optional_package_and_needs_no_extra(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for name in EXTRAS:  # first on the path of every process: `import NAME` fails
        (blocked / f"{name}.py").write_text("raise ImportError('blocked by the test')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(blocked), str(REPO_ROOT)]),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the demo is generated, without onnx
    }
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_AND_REPORT],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "agent" in loaded
    assert "onnxruntime" in loaded
    assert not loaded.intersection(NOT_FOR_A_PLAIN_SERVE), sorted(
        loaded.intersection(NOT_FOR_A_PLAIN_SERVE)
    )
    assert (tmp_path / "cache" / "edge-agent" / "demo-repository" / "mixed_add").is_dir()


def test_the_serve_path_imports_no_sync_or_onnx_packages() -> None:
    code = (
        "import json, sys\n"
        "import agent.cli.commands, agent.cli.serve, agent.runtime.daemon\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = set(json.loads(done.stdout))
    assert "agent" in loaded
    assert not loaded.intersection(HEAVY), sorted(loaded.intersection(HEAVY))


def test_sync_names_still_resolve_on_first_use() -> None:
    import sync
    from sync import policy

    assert sync.SyncClient.__name__ == "SyncClient"
    assert sync.parse_desired is policy.parse_desired
    assert sync.parse_desired(["m=latest"]) == {"m": policy.Desired(policy.Kind.LATEST)}
    with pytest.raises(AttributeError, match="NoSuchThing"):
        getattr(sync, "NoSuchThing")  # noqa: B009 - the name is unknown on purpose
