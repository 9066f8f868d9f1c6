"""The agent itself as the reboot: a cache of real ONNX models, cut, then `edge-agent serve`.

    python -m tests.powercut.agent_boot MOUNT AUX      # the workload, on the power-cut mount

The workload installs, activates and rolls back versions of an MLP whose weights differ per
version; after a cut, `boot_and_infer` starts the agent on the image as a fresh process and asks
it for an inference: the version that answers must be one the run reported active (or the one
being activated at the cut), and its answer must be that version's, computed here with ONNX
Runtime from the same model. A version half-installed or mixed would not load, or would answer
wrongly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

from tests.powercut.mount import mark

MODEL = "m"
#: (operation, version): the run's script.
SCRIPT: tuple[tuple[str, int], ...] = (
    ("install", 1),
    ("activate", 1),
    ("install", 2),
    ("activate", 2),
    ("rollback", 1),
    ("activate", 2),
)


@cache
def model_bytes(version: int) -> bytes:
    """The ONNX MLP of a version (small: 64 → 16 → 10)."""
    from agent.runtime.demo import mlp_model

    return bytes(mlp_model(hidden=16, seed=version).SerializeToString())


def expected_output(version: int) -> np.ndarray:
    """What a version answers to `tests.support.MLP_X`."""
    import onnxruntime as ort

    from tests.support import MLP_X

    session = ort.InferenceSession(model_bytes(version))
    out: np.ndarray = session.run(None, {"INPUT0": MLP_X})[0]
    return out.ravel()


def allowed_versions(marks: Sequence[str]) -> set[int | None]:
    """The versions the agent may serve after a cut with these marks reported."""
    targets = [v for op, v in SCRIPT if op != "install"]
    n = sum(1 for m in marks if m.startswith(f"active:{MODEL}:"))
    allowed: set[int | None] = {targets[n - 1] if n else None}
    if n < len(targets):
        allowed.add(targets[n])
    return allowed


def run(mount: Path, aux: Path) -> None:
    """The workload (module docstring)."""
    from model_cache import ModelCache
    from tests.models import M_CONFIG

    cache_ = ModelCache(mount / "cache")
    for op, version in SCRIPT:
        if op == "install":
            source = aux / "src" / str(version) / MODEL
            (source / str(version)).mkdir(parents=True)
            (source / "config.pbtxt").write_text(M_CONFIG)
            (source / str(version) / "model.onnx").write_bytes(model_bytes(version))
            cache_.install(MODEL, version, source)
            mark(mount, f"installed:{MODEL}:{version}")
        else:
            if op == "activate":
                cache_.activate(MODEL, version)
            else:
                assert cache_.rollback(MODEL).version == version
            mark(mount, f"active:{MODEL}:{version}")
    cache_.close()


def boot_and_infer(image: Path) -> tuple[int | None, np.ndarray | None]:
    """Start `edge-agent serve` on the image's cache; one inference; stop it.

    Returns:
        (the version that answered, its output), or (None, None) when no version serves.
    """
    import urllib.error

    from tests.support import LOGS, infer_mlp, wait_listening

    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--cache-dir", str(image / "cache"),
         "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        port = wait_listening(proc)
        try:
            version, out = infer_mlp(port)
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 404):  # no version serves (a cut before the first activation)
                return None, None
            raise
        return int(version), out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        LOGS.pop(proc.pid, None)
        if proc.stderr is not None:
            proc.stderr.close()


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]))
