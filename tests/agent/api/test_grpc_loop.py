"""The loop gRPC engine (`server.grpc_engine = "loop"`, the default) with real gRPC clients.

Every other gRPC test runs against the default engine too; here is what is the engine's own:
limits, malformed clients, flow control, streaming, restricted protocols, TLS, perf_analyzer.
The grpc.aio engine keeps its own run of the client tests (test_grpc_engine_grpcio.py).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from agent.api.grpc import wire as grpc_wire
from agent.api.grpc.loop import frames
from agent.api.grpc.loop.server import LoopGrpcServer, Method
from agent.api.http.limits import ConnectionLimits
from agent.config.choices import GrpcEngine, ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.daemon import RunningAgent
from tests.agent.api.test_decoupled_grpc import MODEL as STREAMER
from tests.agent.api.test_decoupled_grpc import collect, request
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.models import IDENTITY_TYPES, scale_model, write_versions
from tests.python_models import write_python_model
from tests.server import running_agent
from tests.support import perf_analyzer_throughput, sample, wait_until
from tests.tls_certs import Pem, TestPki, served_serial

LIMIT = 1 << 20
X = np.arange(4, dtype=np.float32).reshape(1, 4)


def loop_server(**options: object) -> ServerConfig:
    engine = GrpcEngine.LOOP
    return ServerConfig(http_port=0, grpc_port=0, metrics_port=-1, grpc_engine=engine, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=loop_server(max_request_bytes=LIMIT),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def stub(agent: RunningAgent) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def mlp_request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="mlp_classifier")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(np.ones((1, 64), np.float32).tobytes())
    return message


def test_a_message_over_the_limit_is_resource_exhausted(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    message = mlp_request()
    message.raw_input_contents[0] = b"\0" * (LIMIT + 1)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in str(info.value.details())
    assert stub.ModelInfer(mlp_request(), timeout=30).model_name == "mlp_classifier"


def test_repeated_infer_calls_take_the_planned_path_and_answer_each_its_own(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    """ModelInfer reaches the servicer as bytes; a repeated description is decoded once."""
    plans = grpc_wire.plan_cache_info()
    answers = []
    for value in (0.0, 1.0, 2.0):
        message = mlp_request()
        message.raw_input_contents[0] = np.full((1, 64), value, np.float32).tobytes()
        reply = stub.ModelInfer(message, timeout=30)
        assert [o.name for o in reply.outputs] == ["OUTPUT0"]
        answers.append(np.frombuffer(reply.raw_output_contents[0], np.float32))
    assert not np.array_equal(answers[0], answers[2])  # each call's own data was served
    after = grpc_wire.plan_cache_info()
    assert after.planned >= plans.planned + 3
    assert after.described <= plans.described + 1  # the description was read once at most
    wrong = mlp_request()
    wrong.raw_input_contents[0] = b"\0" * 12
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(wrong, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'INPUT0': binary data is 12 bytes but shape [1, 64] of FP32 needs 256" in str(
        info.value.details()
    )


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_served(agent: RunningAgent, algorithm: str) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    tensor = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    result = client.infer("mlp_classifier", [tensor], compression_algorithm=algorithm)
    assert result.as_numpy("OUTPUT0").shape == (1, 10)


def test_an_unknown_method_is_unimplemented(agent: RunningAgent) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/inference.GRPCInferenceService/Nope"
        )
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=30)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_an_unknown_model_is_triton_s_error(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    message = mlp_request()
    message.model_name = "nope"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Request for unknown model: 'nope' is not found" in str(info.value.details())


def test_a_response_over_the_client_window_arrives_whole(agent: RunningAgent) -> None:
    rng = np.random.default_rng(5)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    inputs, sent = [], {}
    for datatype in IDENTITY_TYPES:
        data = sample(datatype, (4, 3), rng)
        if datatype == "BYTES":  # 12 elements of 20 KB: several 64 KiB windows
            data = np.array([bytes([65 + k]) * 20_000 for k in range(12)], object).reshape(4, 3)
        tensor = grpcclient.InferInput(f"IN_{datatype}", [4, 3], datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
        sent[datatype] = data
    result = client.infer("identity_all", inputs)
    assert result.get_response().ByteSize() > 200_000  # several 64 KiB windows
    for datatype, data in sent.items():
        got = result.as_numpy(f"OUT_{datatype}")
        if datatype == "BYTES":
            assert [bytes(v) for v in got.ravel()] == list(data.ravel())
        else:
            np.testing.assert_array_equal(got, data)


def test_many_concurrent_calls_on_one_channel(agent: RunningAgent) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")

    def infer(seed: int) -> float:
        tensor = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.full((1, 64), seed, np.float32))
        out = client.infer("mlp_classifier", [tensor], request_id=str(seed))
        assert out.get_response().id == str(seed)
        return float(out.as_numpy("OUTPUT0").sum())

    with ThreadPoolExecutor(32) as pool:
        sums = list(pool.map(infer, [k % 4 for k in range(400)]))
    assert sums[:4] * 100 == sums  # the same input, the same answer


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
        frames.PREFACE + b"\x00\x00\x04\x09\x00\x00\x00\x00\x00garbage-garbage",
    ],
    ids=["http1", "bad-frames"],
)
def test_a_garbage_client_is_closed_and_the_server_goes_on(
    agent: RunningAgent, stub: pb_grpc.GRPCInferenceServiceStub, garbage: bytes
) -> None:
    assert agent.grpc_port is not None
    with socket.create_connection(("127.0.0.1", agent.grpc_port), timeout=30) as raw:
        raw.sendall(garbage)
        received = b""
        while chunk := raw.recv(65536):  # until the server closes
            received += chunk
    buffer, last = bytearray(received), None
    while (parsed := frames.take_frame(buffer, 1 << 24)) is not None:
        last = parsed
    assert last is not None
    assert last[0] == frames.GOAWAY
    assert int.from_bytes(last[3][4:8], "big") in (frames.PROTOCOL_ERROR, frames.FRAME_SIZE_ERROR)
    assert stub.ModelInfer(mlp_request(), timeout=30).model_name == "mlp_classifier"


def test_perf_analyzer_over_the_loop_engine(agent: RunningAgent) -> None:
    throughput = perf_analyzer_throughput(
        "-m",
        "mlp_classifier",
        "-u",
        f"127.0.0.1:{agent.grpc_port}",
        "-i",
        "grpc",
        "--concurrency-range",
        "4",
        "--measurement-interval",
        "1000",
        "-b",
        "1",
    )
    assert throughput > 0


# --- connection limits -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=loop_server(max_connections=2, header_timeout_ms=300, idle_timeout_ms=400),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


def _until_closed(raw: socket.socket) -> bytes:
    received = b""
    while chunk := raw.recv(65536):
        received += chunk
    return received


def test_a_client_that_never_handshakes_is_cut_off(limited: RunningAgent) -> None:
    assert limited.grpc_port is not None
    with socket.create_connection(("127.0.0.1", limited.grpc_port), timeout=30) as raw:
        _until_closed(raw)  # returns: the server closed it


def test_an_idle_connection_gets_goaway(limited: RunningAgent) -> None:
    assert limited.grpc_port is not None
    with socket.create_connection(("127.0.0.1", limited.grpc_port), timeout=30) as raw:
        raw.sendall(frames.PREFACE + frames.settings_frame({}))
        received = _until_closed(raw)
    assert b"max_idle" in received  # GOAWAY's debug data


def test_connections_over_the_cap_are_closed(limited: RunningAgent) -> None:
    assert limited.grpc_port is not None
    address = ("127.0.0.1", limited.grpc_port)
    with socket.create_connection(address) as one, socket.create_connection(address) as two:
        for raw in (one, two):
            raw.sendall(frames.PREFACE + frames.settings_frame({}))
            raw.recv(9)  # served: our SETTINGS
        with socket.create_connection(address, timeout=30) as third:
            assert _until_closed(third) == b""


# --- decoupled models over ModelStreamInfer ----------------------------------------------------


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def streaming(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("streaming")
    write_python_model(repo, STREAMER, DECOUPLED_MODEL, decoupled_config(STREAMER, markers))
    config = AgentConfig(
        server=loop_server(),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
    )
    with running_agent(config) as running:
        yield f"127.0.0.1:{running.grpc_port}"


def test_streams_of_a_decoupled_model(streaming: str) -> None:
    with ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(lambda k: collect(streaming, [request(5, f"s{k}")]), range(8)))
    for k, got in enumerate(streams):
        assert got[f"s{k}"] == [*((i, False) for i in range(5)), (None, True)], k
    assert collect(streaming, [request(0, "zero")]) == {"zero": [(None, True)]}


def test_closing_a_stream_cancels_its_requests(streaming: str, markers: Path) -> None:
    requests = [request(42, "endless", mode=2), *(request(3, f"r{k}") for k in range(3))]
    got = collect(streaming, requests, until={f"r{k}" for k in range(3)})
    for k in range(3):
        assert got[f"r{k}"] == [(0, False), (1, False), (2, False), (None, True)], k
    wait_until((markers / "cancelled-42").exists, "the model to see the cancellation")


def test_a_stream_past_its_deadline_is_deadline_exceeded(streaming: str) -> None:
    with grpc.insecure_channel(streaming) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        message = pb.ModelInferRequest(model_name=STREAMER, id="slow")
        for name, value in (("N", 42), ("MODE", 2), ("ERROR_AT", -1)):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 1])
            message.raw_input_contents.append(np.array([[value]], np.int32).tobytes())
        responses = stub.ModelStreamInfer(iter([message]), timeout=1.0)
        with pytest.raises(grpc.RpcError) as info:
            for _ in responses:
                pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# --- restricted protocols, model control, TLS ------------------------------------------------


ADMIN = "model-repository,model-config:admin-key=s3cret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: TestPki) -> Iterator[RunningAgent]:
    """Mutual TLS, restricted control, explicit model control over one model "s"."""
    repo = tmp_path_factory.mktemp("secure") / "models"
    write_versions(repo, "s", {1: scale_model(2.0)})
    server = pki.server(serial=41)
    config = AgentConfig(
        server=loop_server(
            tls_cert_file=server.cert,
            tls_key_file=server.key,
            tls_client_ca_file=pki.ca.cert,
            grpc_restricted_protocol=(ADMIN,),
        ),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("s",),
        ),
    )
    with running_agent(config) as running:
        yield running


def _mutual_client(agent: RunningAgent, pki: TestPki, pem: Pem) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        f"localhost:{agent.grpc_port}",
        ssl=True,
        root_certificates=str(pki.ca.cert),
        private_key=str(pem.key),
        certificate_chain=str(pem.cert),
    )


def test_mutual_tls_restricted_control_load_and_unload(secure: RunningAgent, pki: TestPki) -> None:
    client = _mutual_client(secure, pki, pki.client())
    admin = {"triton-grpc-protocol-admin-key": "s3cret"}
    try:
        tensor = grpcclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_array_equal(client.infer("s", [tensor]).as_numpy("Y"), X * 2)
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key") as no:
            client.get_model_repository_index()
        assert "UNAVAILABLE" in str(no.value.status())
        index = client.get_model_repository_index(headers=admin)
        assert [(m.name, m.state) for m in index.models] == [("s", "READY")]
        client.unload_model("s", headers=admin)
        wait_until(lambda: not client.is_model_ready("s"), "s to unload")
        client.load_model("s", headers=admin)
        assert client.is_model_ready("s")
        assert client.get_model_config("s", headers=admin).config.name == "s"
    finally:
        client.close()


def test_without_a_client_certificate_tls_is_refused(secure: RunningAgent, pki: TestPki) -> None:
    client = grpcclient.InferenceServerClient(
        f"localhost:{secure.grpc_port}", ssl=True, root_certificates=str(pki.ca.cert)
    )
    try:
        with pytest.raises(InferenceServerException, match=r"StatusCode\.UNAVAILABLE"):
            client.is_server_live(client_timeout=10)
    finally:
        client.close()


def test_a_reloaded_certificate_serves_new_connections(secure: RunningAgent, pki: TestPki) -> None:
    assert secure.grpc_port is not None
    assert secure.tls is not None
    assert served_serial(secure.grpc_port, pki.ca.cert, alpn="h2") == 41
    pki.server(serial=43)  # the same files
    secure.tls.reload()
    assert served_serial(secure.grpc_port, pki.ca.cert, alpn="h2") == 43
    client = _mutual_client(secure, pki, pki.client())
    try:
        assert client.is_server_live()
    finally:
        client.close()


# --- graceful stop -----------------------------------------------------------------------------


def test_stop_refuses_new_connections_and_lets_open_calls_finish() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    entered, release = threading.Event(), asyncio.Event()

    async def slow_live(request: pb.ServerLiveRequest, context: object) -> pb.ServerLiveResponse:
        entered.set()
        await release.wait()
        return pb.ServerLiveResponse(live=True)

    methods = {
        "/inference.GRPCInferenceService/ServerLive": Method(
            slow_live, pb.ServerLiveRequest, streaming=False
        )
    }
    server = LoopGrpcServer(methods, max_message_bytes=LIMIT, limits=ConnectionLimits())
    try:
        port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0, None), loop).result(30)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.ServerLive.future(pb.ServerLiveRequest(), timeout=30)
            assert entered.wait(30)
            stopped = asyncio.run_coroutine_threadsafe(server.stop(30), loop)
            wait_until(lambda: not _accepts(port), "the listener to close")
            assert not stopped.done()  # the open call holds the stop
            loop.call_soon_threadsafe(release.set)
            assert call.result(30).live
            stopped.result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True
