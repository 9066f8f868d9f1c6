"""System shared memory end to end: a real agent, Triton's HTTP and gRPC clients with
`tritonclient.utils.shared_memory`, and perf_analyzer with `--shared-memory system`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.server import running_agent
from tests.support import perf_analyzer_throughput

Client = Any  # httpclient or grpcclient InferenceServerClient: the same shared-memory calls


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, agent: RunningAgent) -> Iterator[Client]:
    if request.param == "http":
        client: Client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions() -> Iterator[tuple[Any, Any, str]]:
    """An input and an output shm object as a client creates them; destroyed afterwards."""
    tag = uuid.uuid4().hex[:12]
    key_in, key_out = f"/ea_in_{tag}", f"/ea_out_{tag}"
    handle_in = shm.create_shared_memory_region("in", key_in, 64 * 1024)
    handle_out = shm.create_shared_memory_region("out", key_out, 4096)
    yield handle_in, handle_out, tag
    shm.destroy_shared_memory_region(handle_in)
    shm.destroy_shared_memory_region(handle_out)


def _lib(client: Client) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _status(client: Client, name: str = "") -> list[dict[str, Any]]:
    """The status as Triton's JSON list, for both clients."""
    if isinstance(client, httpclient.InferenceServerClient):
        return list(client.get_system_shared_memory_status(name))
    doc = client.get_system_shared_memory_status(name, as_json=True)
    return [
        {
            "name": r["name"],
            "key": r["key"],
            "offset": int(r.get("offset", 0)),
            "byte_size": int(r["byte_size"]),
        }
        for r in doc.get("regions", {}).values()
    ]


def _error(client: Client, call: Any) -> str:
    """The status of a failed call: the HTTP code, or the gRPC code's name."""
    with pytest.raises(InferenceServerException) as info:
        call()
    status = str(info.value.status())
    return status.removeprefix("StatusCode.")


def test_server_metadata_lists_the_extension(client: Client) -> None:
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if isinstance(meta, dict) else list(meta.extensions)
    assert "system_shared_memory" in extensions


def test_infer_in_shared_memory_equals_the_normal_path(
    client: Client, regions: tuple[Any, Any, str]
) -> None:
    handle_in, handle_out, tag = regions
    lib = _lib(client)
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    shm.set_shared_memory_region(handle_in, [x], offset=128)
    client.register_system_shared_memory(f"in_{tag}", f"/ea_in_{tag}", 64 * 1024)
    client.register_system_shared_memory(f"out_{tag}", f"/ea_out_{tag}", 2048, offset=1024)
    assert _status(client, f"out_{tag}") == [
        {"name": f"out_{tag}", "key": f"/ea_out_{tag}", "offset": 1024, "byte_size": 2048}
    ]
    assert {r["name"] for r in _status(client)} == {f"in_{tag}", f"out_{tag}"}

    plain = lib.InferInput("INPUT0", [4, 64], "FP32")
    plain.set_data_from_numpy(x)
    expected = client.infer("mlp_classifier", [plain]).as_numpy("OUTPUT0")

    inp = lib.InferInput("INPUT0", [4, 64], "FP32")
    inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=128)
    out = lib.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(f"out_{tag}", 1024, offset=64)
    result = client.infer("mlp_classifier", [inp], outputs=[out])
    meta = result.get_output("OUTPUT0")
    shape = meta["shape"] if isinstance(meta, dict) else list(meta.shape)
    assert [int(d) for d in shape] == list(expected.shape)
    got = shm.get_contents_as_numpy(handle_out, np.float32, expected.shape, offset=1024 + 64)
    np.testing.assert_array_equal(got, expected)

    client.unregister_system_shared_memory(f"in_{tag}")
    assert [r["name"] for r in _status(client)] == [f"out_{tag}"]
    client.unregister_system_shared_memory()
    assert _status(client) == []


def test_mixed_inline_and_shared_memory_tensors(
    client: Client, regions: tuple[Any, Any, str]
) -> None:
    """One input and one output in shm, the others inline: buffers stay with their tensors."""
    handle_in, handle_out, tag = regions
    lib = _lib(client)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.int32)
    shm.set_shared_memory_region(handle_in, [a])
    client.register_system_shared_memory(f"in_{tag}", f"/ea_in_{tag}", a.nbytes)
    client.register_system_shared_memory(f"out_{tag}", f"/ea_out_{tag}", 4096)
    in_a = lib.InferInput("A", [2, 4], "FP32")
    in_a.set_shared_memory(f"in_{tag}", a.nbytes)
    in_b = lib.InferInput("B", [2, 4], "INT32")
    in_b.set_data_from_numpy(b)
    out_sum = lib.InferRequestedOutput("SUM")
    out_sum.set_shared_memory(f"out_{tag}", 4096)
    out_diff = lib.InferRequestedOutput("DIFF")
    result = client.infer("mixed_add", [in_b, in_a], outputs=[out_sum, out_diff])
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle_out, np.float32, [2, 4]), a + b)


def test_errors(client: Client, regions: tuple[Any, Any, str]) -> None:
    _, _, tag = regions
    lib = _lib(client)
    http = lib is httpclient
    client.register_system_shared_memory(f"in_{tag}", f"/ea_in_{tag}", 1024)
    duplicate = _error(
        client, lambda: client.register_system_shared_memory(f"in_{tag}", f"/ea_in_{tag}", 64)
    )
    assert duplicate == ("400" if http else "ALREADY_EXISTS")  # Triton: 400 over HTTP
    invalid = "400" if http else "INVALID_ARGUMENT"
    unknown_key = _error(
        client, lambda: client.register_system_shared_memory("x", f"/ea_none_{tag}", 64)
    )
    assert unknown_key == invalid
    too_far = _error(
        client,
        lambda: client.register_system_shared_memory("x", f"/ea_out_{tag}", 64, offset=4090),
    )
    assert too_far == invalid
    missing = _error(client, lambda: client.get_system_shared_memory_status("nope"))
    assert missing == ("404" if http else "NOT_FOUND")

    def infer(region: str, size: int, offset: int = 0) -> None:
        inp = lib.InferInput("INPUT0", [1, 64], "FP32")
        inp.set_shared_memory(region, size, offset=offset)
        client.infer("mlp_classifier", [inp])

    assert _error(client, lambda: infer("nope", 256)) == ("404" if http else "NOT_FOUND")
    assert _error(client, lambda: infer(f"in_{tag}", 256, offset=1000)) == invalid
    with pytest.raises(InferenceServerException, match=r"input 'INPUT0'.*byte_size 252"):
        infer(f"in_{tag}", 252)

    small = lib.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory(f"in_{tag}", 8)
    inp = lib.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException, match="should be at least") as info:
        client.infer("mlp_classifier", [inp], outputs=[small])
    assert str(info.value.status()).removeprefix("StatusCode.") == invalid


def test_grpc_unregister_unknown_name_is_ok(agent: RunningAgent) -> None:
    """Raw gRPC (no client library): Triton's status codes for the register RPCs."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name="x"))
        with pytest.raises(grpc.RpcError) as info:
            stub.SystemSharedMemoryRegister(
                service_pb2.SystemSharedMemoryRegisterRequest(name="x", key="/a/b", byte_size=8)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(agent: RunningAgent, protocol: str) -> None:
    port = agent.http_port if protocol == "http" else agent.grpc_port
    throughput = perf_analyzer_throughput(
        "-m",
        "mlp_classifier",
        "-u",
        f"127.0.0.1:{port}",
        "-i",
        protocol,
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "4096",
        "--concurrency-range",
        "2",
        "--measurement-interval",
        "1000",
        "-b",
        "1",
    )
    assert throughput > 0


def test_shared_memory_can_be_turned_off(model_repo: Path, regions: tuple[Any, Any, str]) -> None:
    handle_in, _, tag = regions
    x = np.ones((1, 64), np.float32)
    shm.set_shared_memory_region(handle_in, [x])
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, shared_memory=False),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException) as refused:
            client.register_system_shared_memory(f"in_{tag}", f"/ea_in_{tag}", 64 * 1024)
        assert refused.value.status() == "400"
        assert "server.shared_memory = false" in str(refused.value)
        inp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        inp.set_shared_memory(f"in_{tag}", x.nbytes)
        with pytest.raises(InferenceServerException) as infer_refused:
            client.infer("mlp_classifier", [inp])
        assert infer_refused.value.status() == "400"
        assert "turned off" in str(infer_refused.value)
        assert client.get_system_shared_memory_status() == []
        plain = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        plain.set_data_from_numpy(x)
        out = client.infer("mlp_classifier", [plain]).as_numpy("OUTPUT0")
        assert out is not None
        assert out.shape == (1, 10)  # plain tensors are still served: a softmax over 10 classes
        np.testing.assert_allclose(out.sum(), 1.0, rtol=1e-5)
