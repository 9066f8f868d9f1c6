"""Starting a Python model's instance workers: one per instance of each instance group.

Each worker gets the `args` Triton's Python backend passes to `initialize` (model_config as JSON,
model_instance_kind, model_instance_name, model_instance_device_id, model_repository,
model_version, model_name). At load the interpreters start in parallel; then each imports the
model and runs `initialize` (INIT), all within one `initialize_timeout_seconds`, and answers
READY. A worker that failed while serving is started again alone, with the same args
(`restart_worker`, called by `agent.backends.python.supervisor`).
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


def instance_args(
    site: WorkerSite, config: mc.ModelConfig, model_dir: Path
) -> list[dict[str, str]]:
    """The `initialize` args of each instance of the completed `config`, in instance order."""
    config_json = json.dumps(config_to_json(config))
    found = []
    for group in config.instance_group:
        gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
        for i in range(max(1, group.count)):
            device = group.gpus[i % len(group.gpus)] if gpu and group.gpus else 0
            found.append(
                {
                    "model_config": config_json,
                    "model_instance_kind": _INSTANCE_KINDS.get(group.kind, "CPU"),
                    "model_instance_name": f"{group.name}_{i}",
                    "model_instance_device_id": str(device),
                    "model_repository": str(model_dir),
                    "model_version": str(site.version),
                    "model_name": site.name,
                }
            )
    return found


def start_workers(site: WorkerSite, args: list[dict[str, str]], workers: list[Worker]) -> None:
    """Start one worker per instance (`args`: `instance_args`) and initialize each one.

    Each worker is appended to `workers` as soon as it runs, so that the caller ends them all
    when this raises.

    Raises:
        ModelLoadError: a worker failed to start, import the model file or initialize, or gave
            no answer in time (it is killed).
    """
    for index, instance in enumerate(args):
        workers.append(
            spawn_worker(site.launcher, index, instance["model_instance_name"], site.name)
        )
    # Interpreters start in parallel; then each imports the model and initializes.
    for worker, instance in zip(workers, args, strict=True):
        _send_init(site, worker, instance)
    deadline = time.monotonic() + site.timeouts.initialize_s
    for worker in workers:
        _await_ready(site, worker, deadline)
    logger.info(
        "python model %s version %d: %d worker(s), pids %s",
        site.name,
        site.version,
        len(workers),
        [w.process.pid for w in workers],
        extra={"model": site.name, "version": site.version},
    )


def restart_worker(site: WorkerSite, args: dict[str, str], index: int) -> Worker:
    """Start instance `index` again in a new worker and initialize it (blocking: up to
    `initialize_timeout_seconds`).

    Raises:
        ModelLoadError: as `start_workers`; the new worker is ended.
    """
    worker = spawn_worker(site.launcher, index, args["model_instance_name"], site.name)
    try:
        _send_init(site, worker, args)
        _await_ready(site, worker, time.monotonic() + site.timeouts.initialize_s)
    except BaseException:
        kill_worker(worker)
        worker.close()
        site.side.release(worker)
        raise
    logger.info(
        "python model %s version %d instance %s: worker restarted, pid %d",
        site.name,
        site.version,
        worker.name,
        worker.process.pid,
        extra={"model": site.name, "version": site.version},
    )
    return worker


def _load_error(site: WorkerSite, worker: Worker, reason: str) -> ModelLoadError:
    return ModelLoadError(
        f"python model '{site.name}' version {site.version} instance {worker.index}: "
        f"{site.model_file}: {reason}"
    )


def _send_init(site: WorkerSite, worker: Worker, args: dict[str, str]) -> None:
    meta = {"model_file": str(site.model_file), "args": args}
    try:
        worker.send(ipc.Message(ipc.INIT, meta))
    except OSError:
        raise _load_error(site, worker, exit_reason(worker)) from None


def _await_ready(site: WorkerSite, worker: Worker, deadline: float) -> None:
    try:
        reply = site.side.receive(worker, deadline)
    except TimeoutError:
        kill_worker(worker)
        raise _load_error(
            site, worker, f"initialize gave no answer within {site.timeouts.initialize_s:g} s"
        ) from None
    except (EOFError, OSError, ipc.WireError):
        raise _load_error(site, worker, exit_reason(worker)) from None
    if reply.kind != ipc.READY:
        message = str(reply.meta.get("message", reply.kind))
        if reply.meta.get("user"):  # the model raised: its error and frames, as Triton gives them
            raise ModelLoadError(message)
        raise _load_error(site, worker, message)
    worker.ready = True
