"""A serving agent does not load what only other commands need (memory on a small device)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What each costs in RSS on the development machine: boto3 + python-tuf + cryptography ~26 MiB
# (only with [sync]), onnx ~11 MiB (only for quantize, poll mode checks and demo generation),
# opentelemetry (only with trace_mode = "opentelemetry").
HEAVY = ("boto3", "botocore", "tuf", "securesystemslib", "onnx", "sklearn", "opentelemetry")


def test_the_serve_path_imports_no_sync_or_onnx_packages() -> None:
    code = (
        "import json, sys\n"
        "import agent.cli.commands, agent.runtime.daemon\n"
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
