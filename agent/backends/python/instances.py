"""Starting a Python model's instance workers: one per instance of each instance group.

Each worker gets the `args` Triton's Python backend passes to `initialize` (model_config as JSON,
model_instance_kind, model_instance_name, model_instance_device_id, model_repository,
model_version, model_name). The interpreters start in parallel; then each imports the model and
runs `initialize` (INIT), all within one `initialize_timeout_seconds`, and answers READY.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from agent.backends.python import ipc
from agent.backends.python.config import Timeouts
from agent.backends.python.process import Launcher, Worker, exit_reason, kill_worker, spawn_worker
from agent.backends.python.side_messages import SideMessages
from agent.errors import ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import config_to_json

# The Python backend's logger: its load lines stay under its name.
logger = logging.getLogger("agent.backends.python.backend")

# args["model_instance_kind"] as Triton passes it (KIND_AUTO is resolved before this).
_INSTANCE_KINDS = {mc.ModelInstanceGroup.KIND_GPU: "GPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}


@dataclass(frozen=True, slots=True)
class WorkerSite:
    """The model version whose workers start: who it is, its file, its timeouts, the launcher
    that starts its processes and the handler of their side messages."""

    name: str
    version: int
    model_file: Path
    timeouts: Timeouts
    launcher: Launcher
    side: SideMessages


def start_workers(
    site: WorkerSite, config: mc.ModelConfig, model_dir: Path, workers: list[Worker]
) -> None:
    """Start the instance workers of the completed `config` and initialize each one.

    Each worker is appended to `workers` as soon as it runs, so that the caller ends them all
    when this raises.

    Raises:
        ModelLoadError: a worker failed to start, import the model file or initialize, or gave
            no answer in time (it is killed).
    """
    config_json = json.dumps(config_to_json(config))
    pending = []
    for group in config.instance_group:
        gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
        for i in range(max(1, group.count)):
            index = len(workers)
            device = group.gpus[i % len(group.gpus)] if gpu and group.gpus else 0
            args = {
                "model_config": config_json,
                "model_instance_kind": _INSTANCE_KINDS.get(group.kind, "CPU"),
                "model_instance_name": f"{group.name}_{i}",
                "model_instance_device_id": str(device),
                "model_repository": str(model_dir),
                "model_version": str(site.version),
                "model_name": site.name,
            }
            worker = spawn_worker(site.launcher, index, args["model_instance_name"], site.name)
            workers.append(worker)
            pending.append((worker, args))

    def load_error(worker: Worker, reason: str) -> ModelLoadError:
        return ModelLoadError(
            f"python model '{site.name}' version {site.version} instance {worker.index}: "
            f"{site.model_file}: {reason}"
        )

    # Interpreters start in parallel; then each imports the model and initializes.
    for worker, args in pending:
        meta = {"model_file": str(site.model_file), "args": args}
        try:
            ipc.send(worker.conn, ipc.Message(ipc.INIT, meta))
        except OSError:
            raise load_error(worker, exit_reason(worker)) from None
    deadline = time.monotonic() + site.timeouts.initialize_s
    for worker, _ in pending:
        try:
            reply = site.side.receive(worker, deadline)
        except TimeoutError:
            kill_worker(worker)
            raise load_error(
                worker, f"initialize gave no answer within {site.timeouts.initialize_s:g} s"
            ) from None
        except (EOFError, OSError, ipc.WireError):
            raise load_error(worker, exit_reason(worker)) from None
        if reply.kind != ipc.READY:
            raise load_error(worker, str(reply.meta.get("message", reply.kind)))
        worker.ready = True
    logger.info(
        "python model %s version %d: %d worker(s), pids %s",
        site.name,
        site.version,
        len(workers),
        [w.process.pid for w in workers],
        extra={"model": site.name, "version": site.version},
    )
