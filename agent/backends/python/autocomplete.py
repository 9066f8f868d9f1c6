"""A Python model's `auto_complete_config`, run in a short-lived worker before any instance.

As Triton's auto-complete stub: one worker imports the model file and runs
`TritonPythonModel.auto_complete_config` on the config (as JSON, `pb_utils.ModelConfig`); it
answers the completed config and exits. Its errors fail the load with the model's message.
"""

from __future__ import annotations

import json
import time

from agent.backends.python import ipc
from agent.backends.python.config import PYTHON_BACKEND
from agent.backends.python.instances import WorkerSite
from agent.backends.python.process import exit_reason, kill_worker, reap_worker, spawn_worker
from agent.errors import ModelConfigError, ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import config_from_json, config_to_json


def auto_complete_in_worker(site: WorkerSite, config: mc.ModelConfig) -> mc.ModelConfig:
    """The config after the model's `auto_complete_config`, run in a worker of its own.

    Raises:
        ModelLoadError: the file does not import, auto_complete_config raised (Triton's
            ValueError wording for a contradiction with config.pbtxt) or returned no
            ModelConfig, or the worker hung or died.
    """
    named = mc.ModelConfig()
    named.CopyFrom(config)
    named.name = named.name or site.name
    named.backend = named.backend or PYTHON_BACKEND
    meta = {
        "model_file": str(site.model_file),
        "config": json.dumps(config_to_json(named)),
        "model_name": site.name,
    }
    worker = spawn_worker(site.launcher, -1, "auto-complete", site.name)
    where = f"python model '{site.name}' version {site.version}: {site.model_file}: auto-complete"
    try:
        ipc.send(worker.conn, ipc.Message(ipc.AUTOCOMPLETE, meta))
        reply = site.side.receive(worker, time.monotonic() + site.timeouts.initialize_s)
    except TimeoutError:
        kill_worker(worker)
        raise ModelLoadError(
            f"{where} gave no answer within {site.timeouts.initialize_s:g} s"
        ) from None
    except (EOFError, OSError, ipc.WireError):
        raise ModelLoadError(f"{where}: {exit_reason(worker)}") from None
    finally:
        worker.close()
        site.side.release(worker)
    reap_worker(worker)  # it exits after answering
    if reply.kind != ipc.COMPLETED:
        raise ModelLoadError(f"{where} failed: {reply.meta.get('message', reply.kind)}")
    try:
        return config_from_json(json.loads(str(reply.meta["config"])))
    except (ValueError, ModelConfigError) as exc:
        text = exc.message if isinstance(exc, ModelConfigError) else str(exc)
        raise ModelLoadError(f"{where} returned an invalid config: {text}") from None
