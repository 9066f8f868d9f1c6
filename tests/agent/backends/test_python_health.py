"""A Python model's workers take care of themselves: a real agent, real worker processes.

A worker killed with no traffic (as the OOM killer does) is noticed at once and replaced; one
stopped under traffic (SIGSTOP) is found by its heartbeat, killed and replaced; a model whose
`initialize` fails after its first start backs off and gives up; readiness, the index and the
status document say the same throughout. Each bound is measured with monotonic clocks around a
bounded poll, never slept out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.backends.python.backend import PythonBackend
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.python_models import BEHAVIOUR_MODEL, behaviour_config, write_python_model
from tests.server import running_agent
from tests.support import http_get, wait_until

pytestmark = pytest.mark.e2e  # real agents and worker processes

NOT_READY_WITHIN_S = 1.0
SERVING_AGAIN_WITHIN_S = 15.0
STOPPED_SERVING_AGAIN_WITHIN_S = 40.0

# Initializes once; every later start of an instance fails (the first start writes a marker, the
# later ones record when they ran, then raise).
INIT_ONCE_MODEL = BEHAVIOUR_MODEL.replace(
    """    def initialize(self, args):
        config = json.loads(args["model_config"])
""",
    """    def initialize(self, args):
        config = json.loads(args["model_config"])
        marker = config["parameters"]["attempts"]["string_value"]
        if os.path.exists(marker):
            with open(marker, "a") as f:
                f.write(f"{time.monotonic()}\\n")
            raise RuntimeError("the weights are gone")
        open(marker, "w").close()
""",
)


def attempts_config(name: str, attempts: Path) -> str:
    return behaviour_config(name) + (
        f'parameters {{ key: "attempts" value {{ string_value: "{attempts}" }} }}\n'
    )


def config_for(repo: Path, *, strict_readiness: bool = True, **models: Any) -> AgentConfig:
    return AgentConfig(
        server=ServerConfig(
            http_port=0, grpc_port=-1, metrics_port=-1, strict_readiness=strict_readiness
        ),
        models=ModelsConfig(repository=repo, intra_op_threads=1, **models),
    )


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("health") / "models"
    write_python_model(repo, "idle", BEHAVIOUR_MODEL, behaviour_config("idle"))
    write_python_model(repo, "solo", BEHAVIOUR_MODEL, behaviour_config("solo"))
    write_python_model(repo, "busy", BEHAVIOUR_MODEL, behaviour_config("busy"))
    with running_agent(config_for(repo)) as running:  # the shipped health settings
        yield running


def worker_pid(agent: RunningAgent, model: str) -> int | None:
    served = next(m for m in agent.registry.served_models() if m.name == model)
    backend = served.versions[1].backend
    assert isinstance(backend, PythonBackend)
    pids = backend.worker_pids
    return pids[0] if pids else None


def status(port: int, path: str) -> int:
    return http_get(f"http://127.0.0.1:{port}{path}")[0]


def document(port: int) -> dict[str, Any]:
    code, body = http_get(f"http://127.0.0.1:{port}/v2/status")
    assert code == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def index_row(doc: dict[str, Any], model: str) -> dict[str, Any]:
    (row,) = [r for r in doc["models"] if r["name"] == model]
    return dict(row)


def events(doc: dict[str, Any], model: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in doc["events"] if e["model"] == model and e["event"] == kind]


def infer_pid(port: int, model: str, value: float = 2.0) -> int:
    """One inference; the PID of the worker that answered (raises on failure)."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    try:
        inp = httpclient.InferInput("X", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
        result = client.infer(model, [inp])
        y, pid = result.as_numpy("Y"), result.as_numpy("PID")
        assert y is not None
        assert pid is not None
        np.testing.assert_array_equal(y, np.full((1, 1), 2 * value, dtype=np.float32))
        return int(pid[0, 0])
    finally:
        client.close()


def serves(port: int, model: str, other_than: int) -> bool:
    try:
        return infer_pid(port, model) != other_than
    except InferenceServerException:
        return False


def test_a_killed_idle_worker_is_noticed_at_once_and_replaced(agent: RunningAgent) -> None:
    port = agent.http_port
    pid = worker_pid(agent, "idle")
    assert pid is not None
    assert infer_pid(port, "idle") == pid
    assert status(port, "/v2/health/ready") == 200

    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: status(port, "/v2/models/idle/ready") == 400, "idle NOT READY", timeout_s=5)
    not_ready_s = time.monotonic() - killed
    assert not_ready_s <= NOT_READY_WITHIN_S, f"NOT READY after {not_ready_s:.2f} s"
    # While it restarts everything says the same: strict readiness, the index, the status page.
    down = document(port)
    if index_row(down, "idle")["state"] != "READY":  # unless it is back already
        assert "killed by signal 9" in index_row(down, "idle")["reason"]

    wait_until(lambda: serves(port, "idle", pid), "idle serving again", timeout_s=30)
    serving_s = time.monotonic() - killed
    print(
        f"kill -9 of an idle worker: NOT READY after {not_ready_s:.3f} s, "
        f"serving again after {serving_s:.2f} s"
    )
    assert serving_s <= SERVING_AGAIN_WITHIN_S, f"serving again after {serving_s:.2f} s"
    assert status(port, "/v2/models/idle/ready") == 200
    assert status(port, "/v2/health/ready") == 200
    doc = document(port)
    assert doc["ready"] is True
    assert index_row(doc, "idle")["state"] == "READY"
    # One event each, to the status page (and the log and the fleet: the same EventTee).
    (failed,) = events(doc, "idle", "instance_failed")
    assert failed["detail"]["reason"] == f"worker (pid {pid}) killed by signal 9"
    assert failed["detail"]["ready"] is False
    assert failed["detail"]["instance"] == "idle_0"
    (restarted,) = events(doc, "idle", "instance_restarted")
    assert restarted["detail"]["ready"] is True


def test_readiness_says_not_ready_while_the_only_instance_restarts(
    agent: RunningAgent,
) -> None:
    """Strict readiness (the default): the server is not ready while a model cannot serve."""
    port = agent.http_port
    pid = worker_pid(agent, "solo")
    assert pid is not None
    seen: list[tuple[int, int, str]] = []

    def observe() -> bool:
        model = status(port, "/v2/models/solo/ready")
        server = status(port, "/v2/health/ready")
        state = index_row(document(port), "solo")["state"]
        seen.append((model, server, state))
        return model == 400

    os.kill(pid, signal.SIGKILL)
    wait_until(observe, "solo NOT READY", timeout_s=5)
    wait_until(lambda: serves(port, "solo", pid), "solo serving again", timeout_s=30)
    # The server was never ready while the model was not (the index said so too, or had it back).
    down = [s for s in seen if s[0] == 400]
    assert down, seen
    assert all(server == 400 for _, server, _ in down), seen
    assert status(port, "/v2/health/ready") == 200


def test_a_stopped_worker_under_traffic_is_found_by_its_heartbeat_and_replaced(
    agent: RunningAgent,
) -> None:
    port = agent.http_port
    pid = worker_pid(agent, "busy")
    assert pid is not None
    stop = threading.Event()
    outcomes: list[tuple[float, int | str]] = []
    lock = threading.Lock()

    def traffic() -> None:
        while not stop.is_set():
            try:
                answer: int | str = infer_pid(port, "busy")
            except InferenceServerException as exc:
                answer = str(exc)
                time.sleep(0.05)  # the model is restarting: do not spin on 404s
            with lock:
                outcomes.append((time.monotonic(), answer))

    threads = [threading.Thread(target=traffic, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(outcomes) >= 6, "traffic flowing")
        stopped = time.monotonic()
        os.kill(pid, signal.SIGSTOP)

        def new_worker_answered() -> bool:
            with lock:
                return any(t > stopped and isinstance(a, int) and a != pid for t, a in outcomes)

        wait_until(new_worker_answered, "busy serving again", timeout_s=60)
        serving_s = time.monotonic() - stopped
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # if it is somehow still there
            os.kill(pid, signal.SIGCONT)
    print(f"SIGSTOP under traffic: serving again after {serving_s:.2f} s")
    assert serving_s <= STOPPED_SERVING_AGAIN_WITHIN_S, f"serving again after {serving_s:.1f} s"
    errors = [a for t, a in outcomes if t > stopped and isinstance(a, str)]
    # The requests it held failed with why; the others waited, or were told it is restarting.
    assert any("hung: no heartbeat answer within 10 s" in e for e in errors), errors
    assert all(
        "hung: no heartbeat answer" in e or "no instance is serving" in e or "busy_0" in e
        for e in errors
    ), errors
    (failed,) = events(document(port), "busy", "instance_failed")
    assert failed["detail"]["reason"].startswith("hung: no heartbeat answer within 10 s")


def test_a_model_whose_initialize_fails_after_its_first_start_backs_off_and_gives_up(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    attempts = tmp_path / "attempts.txt"
    write_python_model(repo, "once", INIT_ONCE_MODEL, attempts_config("once", attempts))
    write_python_model(repo, "steady", BEHAVIOUR_MODEL, behaviour_config("steady"))
    config = config_for(repo, restart_limit=3, restart_backoff_ms=200, restart_backoff_max_ms=5000)
    with running_agent(config) as agent:
        port = agent.http_port
        pid = worker_pid(agent, "once")
        assert pid is not None
        assert infer_pid(port, "once") == pid
        os.kill(pid, signal.SIGKILL)

        def gave_up() -> list[dict[str, Any]]:
            return events(document(port), "once", "crash_loop")

        (crash,) = wait_until(gave_up, "the crash loop", timeout_s=60)
        doc = document(port)
        failures = sorted(
            events(doc, "once", "instance_failed"), key=lambda e: e["detail"]["failures"]
        )
        # The kill, then each restart whose initialize failed, each after a longer back-off.
        assert [e["detail"]["restart_in_s"] for e in failures] == [0.2, 0.4, 0.8]
        assert all("the weights are gone" in e["detail"]["reason"] for e in failures[1:])
        assert len(attempts.read_text().split()) == 3  # three restarts, no more
        reason = crash["detail"]["reason"]
        assert "failed 4 time(s) in a row (3 restart(s))" in reason
        assert "RuntimeError: the weights are gone" in reason
        # UNAVAILABLE for good, with the reason, everywhere; the other model serves on.
        wait_until(lambda: index_row(document(port), "once")["state"] == "UNAVAILABLE", "out")
        shown = index_row(document(port), "once")["reason"]  # with the repository path scrubbed
        assert "failed 4 time(s) in a row (3 restart(s))" in shown
        assert "RuntimeError: the weights are gone\n\nAt:\n" in shown  # Triton's form
        assert "; the version is given up" in shown, shown
        assert status(port, "/v2/models/once/ready") == 400
        assert status(port, "/v2/health/ready") == 400  # strict readiness
        assert document(port)["ready"] is False
        assert status(port, "/v2/models/once/versions/1/ready") == 400
        assert infer_pid(port, "steady") == worker_pid(agent, "steady")


def test_without_strict_readiness_the_server_stays_ready_while_a_model_is_down(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    write_python_model(repo, "idle", BEHAVIOUR_MODEL, behaviour_config("idle"))
    config = config_for(repo, strict_readiness=False, restart_backoff_ms=2000)
    with running_agent(config) as agent:
        port = agent.http_port
        pid = worker_pid(agent, "idle")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: status(port, "/v2/models/idle/ready") == 400, "idle NOT READY")
        assert status(port, "/v2/health/ready") == 200  # Triton's --strict-readiness=false
        assert document(port)["ready"] is True
        wait_until(lambda: serves(port, "idle", pid), "idle serving again")


# Sleeps 1.5 s on X == 5 (a long `execute`, far past the heartbeat's timeout below); before
# that sleep, and while it lasts, the agent's PINGs must still be answered.
SLOW_MODEL = BEHAVIOUR_MODEL.replace(
    """            if first == 7:""",
    """            if first == 5:
                time.sleep(1.5)
            if first == 7:""",
)


def test_a_long_execute_keeps_answering_a_short_heartbeat(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_python_model(repo, "slow", SLOW_MODEL, behaviour_config("slow"))
    config = config_for(repo, heartbeat_interval_ms=50, heartbeat_timeout_ms=400)
    with running_agent(config) as running:
        pid = infer_pid(running.http_port, "slow")
        for _ in range(2):  # the second after an idle spell of the worker
            assert infer_pid(running.http_port, "slow", value=5.0) == pid
        assert events(document(running.http_port), "slow", "instance_failed") == []
