"""Worker processes of Python models: they end with the agent, even when stuck in user code."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient

from tests.deploy.support import agent_process
from tests.python_models import behaviour_config, write_python_model
from tests.support import wait_until

# Like the behaviour model, but X == 7 first leaves a marker, then hangs ignoring the pipe.
STUCK_MODEL = """
import json
import os
import time

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"]

    def execute(self, requests):
        with open(self.marker, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(1)
"""

WAIT_S = 60.0


def workers_of(pid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(pid).children()
        if "agent.backends.python.worker.main" in " ".join(p.cmdline())
    ]


def ended(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def test_workers_end_when_the_agent_is_killed(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    marker = tmp_path / "stuck.pid"
    write_python_model(repo, "stuck", STUCK_MODEL, behaviour_config("stuck", marker=marker))
    write_python_model(repo, "idle", STUCK_MODEL, behaviour_config("idle", marker=marker))
    args = ["--model-repository", str(repo), "--http-port", "0", "--grpc-port", "-1"]
    args += ["--metrics-port", "-1"]
    with agent_process(args, os.environ) as agent:
        port = agent.port()
        workers = workers_of(agent.proc.pid)
        assert len(workers) == 2
        pids = [w.pid for w in workers]

        def call() -> None:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
            inp = httpclient.InferInput("X", [1, 1], "FP32")
            inp.set_data_from_numpy(np.full((1, 1), 7.0, dtype=np.float32))
            # The agent is killed under this call: whatever the client raises is expected.
            with contextlib.suppress(Exception):
                client.infer("stuck", [inp])

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(marker.exists, "the worker entered execute", timeout_s=WAIT_S)
        stuck_pid = int(marker.read_text())
        assert stuck_pid in pids
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
        # The idle worker sees its pipe close; the stuck one never reads it again and only
        # ends through PR_SET_PDEATHSIG.
        wait_until(lambda: ended(pids), f"workers {pids} ended after the agent", timeout_s=WAIT_S)
        caller.join(timeout=WAIT_S)
