"""Both gRPC engines against a client that grants 2^31-1 windows and never reads its socket.

The client (the raw HTTP/2 client of tests/h2_client.py) sends many ModelInfer calls to a model
whose answer is 4 MiB for a 4-byte request, and reads nothing. The agent runs in this process,
so its RSS is this process's (/proc/self/status), sampled on a thread for the whole test. What
is asserted: most calls were never run (the model's statistics), the RSS grew by less than
128 MiB, a normal tritonclient call is served meanwhile, and with a short
`server.send_timeout_ms` the stalled connection is closed (bounded polls, no sleeps).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from agent.config.choices import GrpcEngine
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.runtime.daemon import RunningAgent
from tests import h2_client as h
from tests.h2_client import H2Client
from tests.models import save_ready, scale_model, write_model
from tests.server import running_agent
from tests.support import wait_until

MIB = 1024 * 1024
WIDE = MIB  # FP32 elements of `wide`'s answer: 4 MiB
CALLS = 600
INFER = "/inference.GRPCInferenceService/ModelInfer"
ENGINES = [GrpcEngine.LOOP, GrpcEngine.GRPCIO]


def wide_model() -> onnx.ModelProto:
    """FP32 [1] → [1, WIDE], every element the input's (Expand)."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, WIDE])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["X", "shape"], ["Y"])],
        "wide",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, WIDE])],
        [shape],
    )
    return save_ready(graph)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("backpressure") / "models"
    write_model(root, "wide", wide_model())
    write_model(root, "small", scale_model(2.0))
    return root


@pytest.fixture(scope="module", params=ENGINES, ids=lambda e: e.value)
def agent(repo: Path, request: pytest.FixtureRequest) -> Iterator[RunningAgent]:
    server = ServerConfig(http_port=0, grpc_port=0, metrics_port=-1, grpc_engine=request.param)
    config = AgentConfig(server=server, models=ModelsConfig(repository=repo, intra_op_threads=1))
    with running_agent(config) as running:
        yield running


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class PeakRss:
    """This process's RSS peak, sampled on a thread until `stop`."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return max(self.peak, rss())


def wide_request() -> bytes:
    message = pb.ModelInferRequest(model_name="wide")
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    return message.SerializeToString()


def never_reading(port: int, calls: int = CALLS) -> H2Client:
    """A connection with 2^31-1 windows that has sent `calls` calls to `wide`, and reads no more."""
    conn = H2Client(port)
    conn.handshake({h.INITIAL_WINDOW_SIZE: 2**31 - 1, h.MAX_FRAME_SIZE: 2**24 - 1})
    conn.send(h.window_update(0, 2**31 - 1 - 65535))
    body = h.grpc_message(wide_request())
    for n in range(calls):
        sid = 2 * n + 1
        conn.send(
            conn.headers(sid, h.request_fields(INFER)), h.frame(h.DATA, h.END_STREAM, sid, body)
        )
    return conn


def wide_runs(client: grpcclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics("wide", as_json=True)
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def small_served(client: grpcclient.InferenceServerClient) -> bool:
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    result = client.infer("small", [x], client_timeout=30)
    return bool(result.as_numpy("Y").tolist() == [[0.0, 2.0, 4.0, 6.0]])


def test_a_client_that_never_reads_is_held_and_a_normal_client_is_served(
    agent: RunningAgent,
) -> None:
    assert agent.grpc_port is not None
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        wide = grpcclient.InferInput("X", [1], "FP32")
        wide.set_data_from_numpy(np.ones(1, np.float32))
        assert client.infer("wide", [wide]).as_numpy("Y").shape == (1, WIDE)  # warm
        assert small_served(client)
        port = agent.grpc_port
        assert_held(client, lambda: never_reading(port).sock)
    finally:
        client.close()


def http_wide_request() -> bytes:
    """One HTTP/1.1 request for `wide`'s 4 MiB answer, binary tensors."""
    header = (
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],'
        b'"parameters":{"binary_data_size":4}}],'
        b'"outputs":[{"name":"Y","parameters":{"binary_data":true}}]}'
    )
    body = header + np.ones(1, np.float32).tobytes()
    return (
        b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: localhost\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (len(header), len(body))
    ) + body


def pipelined_never_reading(port: int) -> socket.socket:
    """A connection that sent as many of `CALLS` requests for `wide` as the agent read."""
    slow = socket.create_connection(("127.0.0.1", port))
    slow.setblocking(False)
    pending = memoryview(http_wide_request() * CALLS)
    with contextlib.suppress(BlockingIOError):
        while pending:
            pending = pending[slow.send(pending) :]
    return slow


def assert_held(
    client: grpcclient.InferenceServerClient, open_slow: Callable[[], socket.socket]
) -> None:
    """The slow client `open_slow` opens costs < 128 MiB and fewer than a quarter of its calls run.

    The agent runs what fits in the socket buffers and the connection's cap, then holds the rest
    unrun: its runs of `wide` stop moving while `small` is served meanwhile.
    """
    runs_before = wide_runs(client)
    before = rss()
    peak = PeakRss()
    slow = open_slow()
    try:
        seen: list[int] = []

        def settled() -> bool:
            assert small_served(client)
            seen.append(wide_runs(client))
            return len(seen) > 20 and seen[-1] == seen[-21]

        wait_until(settled, "the slow client's calls to stop running", timeout_s=60)
        growth = peak.stop() - before
    finally:
        peak.stop()
        slow.close()
    assert seen[-1] - runs_before < CALLS // 4, seen[-1] - runs_before
    assert growth < 128 * MIB, f"RSS grew by {growth / MIB:.0f} MiB"


def test_http_requests_pipelined_and_never_read_are_held_as_well(agent: RunningAgent) -> None:
    """HTTP/1.1 already stops reading a connection whose answer waits in the socket: pinned."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        assert_held(client, lambda: pipelined_never_reading(agent.http_port))
    finally:
        client.close()


def _connected(port: int, client: tuple[str, int]) -> bool:
    """Whether this process still holds the server end of the connection from `client`."""
    return any(
        c.laddr and c.raddr and c.laddr[1] == port and c.raddr[1] == client[1]  # (v4 or v6)
        for c in psutil.Process().net_connections("tcp")
    )


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.value)
def test_a_stalled_client_is_closed_after_the_send_timeout(repo: Path, engine: GrpcEngine) -> None:
    server = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=-1, grpc_engine=engine, send_timeout_ms=400
    )
    config = AgentConfig(server=server, models=ModelsConfig(repository=repo, intra_op_threads=1))
    with running_agent(config) as agent:
        port = agent.grpc_port
        assert port is not None
        slow = never_reading(port, calls=100)
        try:
            address = slow.sock.getsockname()
            assert _connected(port, address)
            wait_until(
                lambda: not _connected(port, address),
                "the stalled connection to be closed",
                timeout_s=60,
                interval_s=0.1,
            )
            read_to_end(slow)  # what the client reads now ends: the agent closed its side
        finally:
            slow.close()


def read_to_end(conn: H2Client) -> None:
    """Read until the server's FIN or reset (a socket timeout fails the test)."""
    conn.sock.settimeout(30)
    try:
        while conn.sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass


def test_a_client_that_reads_gets_many_large_answers_at_once(agent: RunningAgent) -> None:
    """The cap holds what is not read, not what is: concurrent 4 MiB answers all arrive."""
    assert agent.grpc_port is not None
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        wide = grpcclient.InferInput("X", [1], "FP32")
        wide.set_data_from_numpy(np.full(1, 3.0, np.float32))
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.infer("wide", [wide]), range(24)))
        assert all(float(a.as_numpy("Y")[0, -1]) == 3.0 for a in answers)
    finally:
        client.close()


def test_an_http_client_that_stopped_reading_is_cut_after_the_send_timeout(repo: Path) -> None:
    server = ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, send_timeout_ms=400)
    config = AgentConfig(server=server, models=ModelsConfig(repository=repo, intra_op_threads=1))
    with running_agent(config) as agent:
        port = agent.http_port
        slow = socket.create_connection(("127.0.0.1", port))
        try:
            slow.sendall(http_wide_request() * 4)  # 16 MiB of answers: more than the sockets hold
            address = slow.getsockname()
            # accepted (until then the agent holds no socket for it), then cut
            wait_until(lambda: _connected(port, address), "the connection accepted", timeout_s=60)
            wait_until(
                lambda: not _connected(port, address),
                "the stalled HTTP connection to be cut",
                timeout_s=60,
                interval_s=0.1,
            )
        finally:
            slow.close()
