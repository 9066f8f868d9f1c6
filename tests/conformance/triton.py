"""The real tritonserver as the oracle: find it, give it a backends folder, start and stop it.

Triton comes from the `nvidia-pytriton` wheel, installed by `make triton` in `.venv-triton` (a
test dependency only: nothing of it ships). The wheel carries `tritonserver` 2.51.0, its libraries
(`nvidia_pytriton.libs/`), the Python backend and one backend stub per Python version; the stub
embeds Debian's libpython3.11, so `/usr/bin/python3` must import numpy below 2.

`find_triton()` says why Triton cannot be had (the fixtures skip with that reason) or where it is.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUB_PYTHON = "3.11"  # the stub's libpython; Debian 12's /usr/bin/python3


@dataclass(frozen=True, slots=True)
class TritonInstall:
    """Where the wheel's pieces lie."""

    server: Path  # pytriton/tritonserver/bin/tritonserver
    libs: Path  # nvidia_pytriton.libs
    backends: Path  # pytriton/tritonserver/backends (the python backend)
    stub: Path  # python_backend_stubs/<version>/triton_python_backend_stub


@dataclass(frozen=True, slots=True)
class TritonServer:
    """A started tritonserver on its ports."""

    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path


def find_triton() -> TritonInstall | str:
    """The install, or why there is none (a sentence for pytest.skip)."""
    venv = Path(os.environ.get("TRITON_VENV", ROOT / ".venv-triton"))
    found = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver/bin/tritonserver"))
    if not found:
        return f"no tritonserver under {venv} (run `make triton`: pip install nvidia-pytriton)"
    server = found[0]
    site = server.parents[3]
    stub = server.parents[1] / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub"
    install = TritonInstall(
        server=server,
        libs=site / "nvidia_pytriton.libs",
        backends=server.parents[1] / "backends",
        stub=stub,
    )
    if not stub.exists():
        return f"the wheel has no Python {STUB_PYTHON} backend stub ({stub})"
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import numpy; assert int(numpy.__version__.split('.')[0]) < 2"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return "Triton's Python stub needs numpy < 2 in /usr/bin/python3 (python3-numpy)"
    return install


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextmanager
def running_triton(
    install: TritonInstall, repo: Path, workdir: Path, *extra: str, timeout_s: float = 120.0
) -> Iterator[TritonServer]:
    """tritonserver on `repo` (free ports, no GPU); stopped (SIGTERM, then SIGKILL) on exit.

    Waits until the server is live and its HTTP service answers; models loading at start are
    done by then (Triton starts its endpoints after the initial loads)."""
    backends = workdir / "backends"
    if not (backends / "python" / "triton_python_backend_stub").exists():
        shutil.copytree(install.backends, backends, dirs_exist_ok=True)
        shutil.copy2(install.stub, backends / "python" / "triton_python_backend_stub")
    server = TritonServer(free_port(), free_port(), free_port(), workdir / "tritonserver.log")
    env = dict(os.environ, LD_LIBRARY_PATH=str(install.libs))
    args = [
        str(install.server),
        f"--backend-directory={backends}",
        f"--model-repository={repo}",
        f"--http-port={server.http_port}",
        f"--grpc-port={server.grpc_port}",
        f"--metrics-port={server.metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--exit-on-error=false",
        "--log-verbose=0",
        *extra,
    ]
    with server.log.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(server.http_port):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = server.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"tritonserver did not start (rc={process.poll()}):\n{tail}")
            time.sleep(0.2)  # polling for start-up, not an assertion
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
