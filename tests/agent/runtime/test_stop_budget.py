"""The stop is bounded by one budget (`agent.runtime.shutdown`), under the unit's stop timeout.

A Python model that blocks holds one request on each protocol (HTTP through the infer lane,
gRPC) when the stop begins. The listeners drain them together until the drain deadline, then
cancel them, and the whole stop ends within the budget. A model that ignores the cancellation
(its worker stuck in user code) holds the unload: the agent process then ends itself once the
whole budget is spent, with `EXIT_OVERRUN` and a line saying so, before systemd's SIGKILL.
The bounds are asserted on measured stop durations; nothing sleeps to wait.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.shutdown import DRAIN_SHARE, EXIT_OVERRUN, StopBudget
from tests.python_models import write_python_model
from tests.server import agent_on_thread
from tests.support import LISTENING, AgentLog, wait_until

# TOKEN (BYTES [1]) names the marker files. Writes `<token>.started`, then waits, up to two
# minutes (a bound for a broken agent, not a timing the tests rely on), for its request to be
# cancelled when the `honours_cancel` parameter is "yes", else for nothing; `<token>.cancelled`.
BLOCKING_MODEL = """
import json
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.markers = Path(parameters["markers"]["string_value"])
        self.honours_cancel = parameters["honours_cancel"]["string_value"] == "yes"

    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "TOKEN").as_numpy()[0].decode()
            (self.markers / (name + ".started")).touch()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if self.honours_cancel and request.is_cancelled():
                    (self.markers / (name + ".cancelled")).touch()
                    break
                time.sleep(0.01)
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
"""


def _write_blocking_model(repo: Path, markers: Path, *, honours_cancel: bool) -> None:
    honours = "yes" if honours_cancel else "no"
    config = f"""
name: "block"
backend: "python"
input [ {{ name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [{{ kind: KIND_CPU count: 2 }}]
parameters {{ key: "markers" value {{ string_value: "{markers}" }} }}
parameters {{ key: "honours_cancel" value {{ string_value: "{honours}" }} }}
parameters {{ key: "execute_timeout_seconds" value {{ string_value: "600" }} }}
"""
    write_python_model(repo, "block", BLOCKING_MODEL, config)


def _http_infer(port: int, token: str) -> socket.socket:
    """Send one request in the infer lane's shape and leave its answer unread."""
    doc = {"inputs": [{"name": "TOKEN", "datatype": "BYTES", "shape": [1], "data": [token]}]}
    body = json.dumps(doc).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"POST /v2/models/block/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
    sock.sendall(head.encode() + b"\r\n" + body)
    return sock


def _grpc_request(token: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="block")
    tensor = request.inputs.add(name="TOKEN", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(token.encode())
    return request


# ---- the budget (pure arithmetic on a clock) ----


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_counts_from_the_stop_and_the_drain_ends_first() -> None:
    clock = Clock()
    budget = StopBudget(40.0, clock)
    clock.now += 50  # before the stop: nothing is spent
    budget.begin()
    assert (budget.left(), budget.drain_left()) == (40.0, 40.0 * DRAIN_SHARE)
    clock.now += 10
    budget.begin()  # a second beginning changes nothing
    assert (budget.left(), budget.drain_left()) == (30.0, 20.0)
    clock.now += 25
    assert (budget.left(), budget.drain_left()) == (5.0, 0.0)
    clock.now += 10
    assert budget.left() == 0.0
    with pytest.raises(ValueError, match="positive"):
        StopBudget(0)


def test_the_default_budget_keeps_its_margin_under_the_units_stop_timeout() -> None:
    unit = (Path(__file__).parents[3] / "systemd" / "edge-agent.service").read_text()
    match = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.MULTILINE)
    assert match is not None
    budget_s = ServerConfig().stop_timeout_ms / 1000
    assert budget_s + 5 <= int(match.group(1))


# ---- an agent in this process ----


def test_slow_requests_on_both_protocols_are_cut_at_the_drain_and_the_stop_keeps_its_budget(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    repo = tmp_path / "models"
    _write_blocking_model(repo, markers, honours_cancel=True)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1, stop_timeout_ms=8000),
        models=ModelsConfig(repository=repo),
    )
    with agent_on_thread(config) as running:
        agent = running.agent
        assert agent.grpc_port is not None
        http = _http_infer(agent.http_port, "http")
        channel = grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.ModelInfer.future(_grpc_request("grpc"), timeout=120)
        try:
            for token in ("http", "grpc"):
                wait_until((markers / f"{token}.started").exists, f"the {token} request to run")
            started = time.monotonic()
            running.run(agent.stop(), timeout=120)
            elapsed = time.monotonic() - started
            budget = agent.budget
            # The drain waited for both until its deadline, and the rest kept inside the budget.
            assert budget.drain_s <= elapsed < budget.total_s, elapsed
            for token in ("http", "grpc"):
                assert (markers / f"{token}.cancelled").exists(), token  # nothing runs on
            http.settimeout(30)
            assert http.recv(1024) == b""  # cut at the deadline: closed, unanswered
            with pytest.raises(grpc.RpcError) as cut:
                call.result(timeout=30)
            assert cut.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        finally:
            http.close()
            channel.close()


# ---- the agent as a process, with a model stuck in user code ----


def test_a_stop_held_past_its_budget_ends_the_process_before_systemd_would(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    repo = tmp_path / "models"
    _write_blocking_model(repo, markers, honours_cancel=False)
    budget_s = 3.0
    env = {**os.environ, "EDGE_AGENT_SERVER_STOP_TIMEOUT_MS": str(int(budget_s * 1000))}
    command = [sys.executable, "-m", "agent", "serve", "--model-repository", str(repo)]
    command += ["--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1"]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    log = AgentLog(proc)
    http: socket.socket | None = None
    try:
        port = int(log.wait_for(LISTENING, 120).group(1))
        http = _http_infer(port, "stuck")
        wait_until((markers / "stuck.started").exists, "the request to run", timeout_s=60)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - started
        # The unit's margin (TimeoutStopSec=45s against the default budget of 40 s) is 5 s.
        assert budget_s <= elapsed < budget_s + 5.0, elapsed
        assert code == EXIT_OVERRUN
        log.wait_for(re.compile("exiting now, before systemd's SIGKILL"), 10)
        assert not (markers / "stuck.cancelled").exists()  # it was stuck indeed
    finally:
        if http is not None:
            http.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
