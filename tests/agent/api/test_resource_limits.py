"""Resource limits answer hostile clients with bounded, documented errors, and the agent goes on
serving good requests (agent/api/http/limits.py, agent/tensors/limits.py, [server] settings)."""

from __future__ import annotations

import json
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from agent.config.loader import load_config
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig, validate
from agent.errors import AgentConfigError, PayloadTooLargeError
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.daemon import RunningAgent
from agent.runtime.fd_limit import raise_open_file_limit
from agent.runtime.listeners import connection_limits
from agent.tensors.limits import TensorLimits, check_declared
from tests.agent.api.test_http_errors import GOOD, assert_still_serves, call, infer_json
from tests.models import build_test_repository
from tests.server import running_agent
from tests.support import WAIT_S, wait_until

MAX_BYTES = 64 * 1024
MAX_ELEMENTS = 1000
INFER = "/v2/models/mlp_classifier/infer"


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def agent(model_repo: Path) -> Iterator[RunningAgent]:
    """Small limits and short timeouts, so each limit is reached quickly."""
    config = AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=0,
            metrics_port=-1,
            max_request_bytes=MAX_BYTES,
            max_bytes_elements=MAX_ELEMENTS,
            header_timeout_ms=300,
            body_timeout_ms=300,
            idle_timeout_ms=300,
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def url(agent: RunningAgent) -> str:
    return f"127.0.0.1:{agent.http_port}"


@pytest.fixture
def stub(agent: RunningAgent) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def answer_or_close(sock: socket.socket, trickle: bytes = b"") -> bytes:
    """Send `trickle` a byte at a time (then nothing) until the server answers or closes the
    connection; returns all it sent back (b"" when it closed without a word)."""
    sock.settimeout(0.05)
    deadline = time.monotonic() + WAIT_S
    received = b""
    pending = iter(trickle)
    while time.monotonic() < deadline:
        byte = next(pending, None)
        try:
            if byte is not None:
                sock.send(bytes([byte]))
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the connection is still open after {WAIT_S} s")


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


# --- declared sizes over server.max_request_bytes -------------------------------------------


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    with connect(port) as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {100 * MAX_BYTES}\r\n\r\n{{".encode()
        )
        status, headers, body = parse_answer(answer_or_close(sock))
    assert status == 413
    assert headers["connection"] == "close"
    assert "server.max_request_bytes" in str(body["error"])
    assert_still_serves(url)


HUGE_SHAPE = [1, 1 << 40]

DECLARED_TOO_LARGE = {
    "json data": {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": HUGE_SHAPE, "data": [0.5]}]
    },
    "shared memory": {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": HUGE_SHAPE,
                "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
            }
        ]
    },
}


@pytest.mark.parametrize("case", sorted(DECLARED_TOO_LARGE))
def test_a_json_request_declaring_a_shape_over_the_limit_gets_413(url: str, case: str) -> None:
    status, body = infer_json(url, DECLARED_TOO_LARGE[case])
    assert status == 413, body
    assert body is not None
    assert "needs 4398046511104 bytes" in body["error"]
    assert "server.max_request_bytes" in body["error"]
    assert_still_serves(url)


def test_a_binary_request_declaring_a_shape_over_the_limit_gets_413(url: str) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": HUGE_SHAPE,
                    "parameters": {"binary_data_size": 16},
                }
            ]
        }
    ).encode()
    for _ in range(2):  # the second one takes the cached-header path
        status, body = call(
            url,
            INFER,
            header + bytes(16),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert status == 413, body
        assert body is not None
        assert "server.max_request_bytes" in body["error"]
    assert_still_serves(url)


def good_grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp_classifier")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.full(64, 0.5, np.float32).tobytes())
    return request


def assert_grpc_still_serves(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    response = stub.ModelInfer(good_grpc_request(), timeout=WAIT_S)
    assert list(response.outputs[0].shape) == [1, 10]


def test_a_grpc_message_over_the_limit_is_resource_exhausted(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = good_grpc_request()
    request.raw_input_contents[0] = bytes(2 * MAX_BYTES)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=WAIT_S)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_grpc_still_serves(stub)


def test_a_grpc_shape_over_the_limit_is_resource_exhausted(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = good_grpc_request()
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend(HUGE_SHAPE)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=WAIT_S)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server.max_request_bytes" in str(info.value.details())
    assert_grpc_still_serves(stub)


# --- BYTES tensors with many tiny elements ----------------------------------------------------


def tiny_strings(count: int) -> bytes:
    return struct.pack("<I", 0) * count  # `count` empty elements, 4 bytes each


def test_a_bytes_tensor_over_max_bytes_elements_is_refused_over_http(url: str) -> None:
    count = MAX_ELEMENTS + 1
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IN_BYTES",
                    "datatype": "BYTES",
                    "shape": [count],
                    "parameters": {"binary_data_size": 4 * count},
                }
            ]
        }
    ).encode()
    status, body = call(
        url,
        "/v2/models/identity_all/infer",
        header + tiny_strings(count),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 413, body
    assert body is not None
    assert f"has {count} elements, over the limit of {MAX_ELEMENTS}" in body["error"]
    assert_still_serves(url)


def test_a_bytes_tensor_over_max_bytes_elements_is_refused_over_grpc(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    count = MAX_ELEMENTS + 1
    request = pb.ModelInferRequest(model_name="identity_all")
    request.inputs.add(name="IN_BYTES", datatype="BYTES", shape=[count])
    request.raw_input_contents.append(tiny_strings(count))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=WAIT_S)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server.max_bytes_elements" in str(info.value.details())
    assert_grpc_still_serves(stub)


def test_the_declared_shape_check_is_exact_at_the_limits() -> None:
    limits = TensorLimits(max_bytes=400, max_bytes_elements=10)
    check_declared("x", "FP32", [10, 10], limits)  # exactly 400 bytes
    check_declared("x", "BYTES", [2, 5], limits)
    check_declared("x", "FP32", [0, 1 << 62], limits)  # no elements at all
    with pytest.raises(PayloadTooLargeError, match="needs 404 bytes"):
        check_declared("x", "FP32", [101], limits)
    with pytest.raises(PayloadTooLargeError, match="has 11 elements"):
        check_declared("x", "BYTES", [11], limits)
    with pytest.raises(PayloadTooLargeError):
        check_declared("x", "UINT8", [1 << 62, 1 << 62], limits)  # no overflow


# --- slow and idle clients --------------------------------------------------------------------


def test_headers_trickled_byte_by_byte_are_cut_off(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    slow = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode() + b"a" * 4000
    with connect(port) as sock:
        assert answer_or_close(sock, slow) == b""  # closed without an answer
    assert_still_serves(url)


def test_a_body_trickled_too_slowly_gets_408(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps(GOOD).encode()
    with connect(port) as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) + 1000}\r\n\r\n".encode()
        )
        status, headers, answer = parse_answer(answer_or_close(sock, body))
    assert status == 408
    assert headers["connection"] == "close"
    assert "server.body_timeout_ms" in str(answer["error"])
    assert_still_serves(url)


def test_an_idle_connection_is_closed(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    with connect(port) as sock:
        assert answer_or_close(sock) == b""
    assert_still_serves(url)


def test_a_keep_alive_connection_is_closed_once_idle(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps(GOOD).encode()
    with connect(port) as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status, _, answer = parse_answer(answer_or_close(sock))
    assert status == 200, answer  # answered, then closed once idle


def test_a_grpc_client_that_never_handshakes_is_cut_off(
    agent: RunningAgent, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    assert agent.grpc_port is not None
    for opening in (b"", b"PRI * HTTP/2.0\r\n"):  # nothing, or part of the HTTP/2 preface
        with connect(agent.grpc_port) as sock:
            answer_or_close(sock, opening)  # returns once closed (grpc may send a GOAWAY first)
    assert_grpc_still_serves(stub)


def test_connections_over_max_connections_get_503(model_repo: Path) -> None:
    config = AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=0,
            metrics_port=-1,
            max_connections=3,
            header_timeout_ms=600_000,  # only the cap closes a connection here
            idle_timeout_ms=600_000,
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        assert agent.grpc_port is not None
        held_grpc = [connect(agent.grpc_port) for _ in range(3)]
        try:
            with connect(agent.grpc_port) as extra:
                answer_or_close(extra)  # returns once the server closed it
        finally:
            for sock in held_grpc:
                sock.close()
        with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            wait_until(lambda: _grpc_serves(stub), "a gRPC request served after the closes")
        url = f"127.0.0.1:{agent.http_port}"
        held = [connect(agent.http_port) for _ in range(3)]
        try:
            # The three may still be in the accept queue: wait until one more is refused.
            with connect(agent.http_port) as extra:
                status, _, body = parse_answer(answer_or_close(extra))
            assert status == 503
            assert "server.max_connections = 3" in str(body["error"])
        finally:
            for sock in held:
                sock.close()
        # Closed ones free their places (the agent notices the closes asynchronously).
        wait_until(lambda: _serves(url), "a good request served after the closes")


def _grpc_serves(stub: pb_grpc.GRPCInferenceServiceStub) -> bool:
    try:
        assert_grpc_still_serves(stub)
    except grpc.RpcError:
        return False
    return True


def _serves(url: str) -> bool:
    try:
        status, _ = infer_json(url, GOOD)
    except OSError:  # refused connections are closed at once: a reset or an empty answer
        return False
    return status == 200


# --- settings -----------------------------------------------------------------------------


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    raise_open_file_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or (hard == resource.RLIM_INFINITY and soft >= 1 << 20)


def test_limit_settings_load_from_toml_and_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        "[server]\nmax_connections = 10\nheader_timeout_ms = 500\nbody_timeout_ms = 600\n"
        "idle_timeout_ms = 700\nmax_bytes_elements = 42\nsend_timeout_ms = 800\n"
    )
    config = load_config(path, serving=False)
    server = config.server
    assert (server.max_connections, server.max_bytes_elements) == (10, 42)
    assert (server.header_timeout_ms, server.body_timeout_ms, server.idle_timeout_ms) == (
        500,
        600,
        700,
    )
    assert connection_limits(config).send_timeout_s == 0.8
    assert ServerConfig().send_timeout_ms == 30_000
    for bad in (
        ServerConfig(max_connections=0),
        ServerConfig(max_bytes_elements=0),
        ServerConfig(header_timeout_ms=0),
        ServerConfig(idle_timeout_ms=5),
        ServerConfig(send_timeout_ms=5),
    ):
        with pytest.raises(AgentConfigError, match="server\\."):
            validate(AgentConfig(server=bad), serving=False)
