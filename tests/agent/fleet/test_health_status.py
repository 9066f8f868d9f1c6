"""The fleet hears what the device's own endpoints say: a Python worker killed on an idle agent
is one event on the events topic and a retained status without that version until it serves
again; a version running on the CPU fallback is flagged in the birth status. A real Mosquitto,
a real agent, real worker processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from agent.backends.python.backend import PythonBackend
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.manager.cli import FleetClient
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from agent.wire.mqtt import Message
from tests.models import M_CONFIG, write_model
from tests.mqtt_support import Broker, first, mqtt_config
from tests.python_models import BEHAVIOUR_MODEL, behaviour_config, write_python_model
from tests.server import running_agent
from tests.support import http_get

pytestmark = pytest.mark.e2e  # an agent on a thread (the broker makes it external too)

TENSORRT = (
    "optimization { execution_accelerators { gpu_execution_accelerator : "
    '[ { name : "tensorrt" } ] } }\n'
)


def py_pid(agent: RunningAgent) -> int:
    served = next(m for m in agent.registry.served_models() if m.name == "py")
    backend = served.versions[1].backend
    assert isinstance(backend, PythonBackend)
    (pid,) = backend.worker_pids
    return pid


def model_entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [m for m in doc["models"] if m["name"] == name]
    return dict(entry)


def is_event(doc: dict[str, Any], event: str) -> bool:
    return doc.get("kind") == "event" and doc.get("event") == event and doc.get("model") == "py"


def is_status(doc: dict[str, Any], versions: list[int]) -> dict[str, Any] | None:
    """The status document when it lists `versions` of py as serving."""
    if doc.get("kind") != "status" or doc.get("state") != "online":
        return None
    return doc if model_entry(doc, "py")["versions"] == versions else None


async def until(stream: Any, *checks: Any) -> list[dict[str, Any]]:
    """Every message (as JSON) until each check has matched one of them."""
    seen: list[dict[str, Any]] = []
    left = list(checks)
    async for message in stream:
        doc = json.loads(message.payload)
        seen.append(doc)
        left = [check for check in left if not check(doc)]
        if not left:
            return seen
    raise AssertionError("stream ended")


def status_where(check: Any) -> Any:
    def match(_message: Message, doc: dict[str, Any]) -> bool:
        return doc.get("kind") == "status" and doc.get("state") == "online" and check(doc)

    return match


@pytest.mark.skipif(
    "TensorrtExecutionProvider" in ort.get_available_providers(),
    reason="this onnxruntime has the TensorRT provider: no fallback to flag here",
)
def test_instance_events_and_the_retained_status_agree_with_the_device(
    broker: Broker, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    write_python_model(repo, "py", BEHAVIOUR_MODEL, behaviour_config("py"))
    write_model(repo, "m", mlp_model(), M_CONFIG + TENSORRT)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            allow_cpu_fallback=True,
            restart_backoff_ms=1000,  # long enough to see the status without py
        ),
        mqtt=mqtt_config(broker, telemetry_interval_ms=60_000, state_dir=tmp_path / "state"),
    )
    with running_agent(config) as agent:
        pid = py_pid(agent)

        async def scenario() -> None:
            async with FleetClient(broker.settings()) as fleet:
                await fleet.watch("dev1")
                stream = fleet.messages()
                birth = await first(stream, status_where(lambda d: True))
                assert model_entry(birth, "py")["versions"] == [1]
                m = model_entry(birth, "m")
                assert m["versions"] == [1]
                assert "TensorrtExecutionProvider" in m["cpu_fallback"]["1"]
                assert m["cpu_fallback"]["1"].startswith("CPU fallback: ")

                os.kill(pid, signal.SIGKILL)
                # Statuses are published at once, events through the outbox: both come, in
                # either order between them, the down status before the one serving again.
                went_down: list[dict[str, Any]] = []

                def down(doc: dict[str, Any]) -> bool:
                    if is_status(doc, []) is not None:
                        went_down.append(doc)
                    return bool(went_down)

                def up_again(doc: dict[str, Any]) -> bool:
                    return bool(went_down) and is_status(doc, [1]) is not None

                seen = await until(
                    stream,
                    lambda d: is_event(d, "instance_failed"),
                    lambda d: is_event(d, "instance_restarted"),
                    down,
                    up_again,
                )
                failed = next(d for d in seen if is_event(d, "instance_failed"))
                assert failed["detail"]["reason"] == f"worker (pid {pid}) killed by signal 9"
                assert failed["detail"]["ready"] is False
                assert "killed by signal 9" in model_entry(went_down[0], "py")["not_ready"]["1"]
                up = [d for d in seen if up_again(d)]
                assert "not_ready" not in model_entry(up[-1], "py")

        asyncio.run(asyncio.wait_for(scenario(), 60))
        # One event of each (no storm), as the device's own status page has them.
        code, body = http_get(f"http://127.0.0.1:{agent.http_port}/v2/status")
        assert code == 200
        kinds = [e["event"] for e in json.loads(body)["events"] if e["model"] == "py"]
        assert sorted(kinds) == ["instance_failed", "instance_restarted"]
