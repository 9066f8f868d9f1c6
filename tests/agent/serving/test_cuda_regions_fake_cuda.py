"""CUDA shared-memory regions on a fake CUDA (no GPU here): the registry's rules, Triton's HTTP
register body, tritonclient's register / status / unregister calls over HTTP and gRPC, and
inference with inputs read from and outputs written to "device" regions, equal to the
host-memory path. The real CUDA IPC path runs in tests/gpu/test_cuda_shared_memory.py.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.errors import ConflictError, InvalidInputError, SharedMemoryNotFoundError
from agent.runtime.daemon import RunningAgent
from agent.serving.cuda_regions import (
    IPC_HANDLE_SIZE,
    CudaRegionRegistry,
    CudaRegionStatus,
    register_request_from_json,
)
from agent.serving.shared_memory import SharedMemoryRegistry
from tests.fakes import FakeCudaIpc


def test_fake_cuda_register_status_unregister() -> None:
    cuda = FakeCudaIpc()
    regions = CudaRegionRegistry(cuda)
    handle, _ = cuda.export(256)
    regions.register("frames", handle, 0, 256)
    assert regions.status() == [CudaRegionStatus("frames", 0, 256)]
    assert regions.status()[0].to_json() == {"name": "frames", "device_id": 0, "byte_size": 256}
    assert regions.status("frames") == regions.status()
    with pytest.raises(ConflictError, match="'frames' already in manager"):
        regions.register("frames", handle, 0, 256)
    regions.unregister("unknown")  # not an error, as in Triton
    regions.unregister("frames")
    assert cuda.log == ["open 256", "close"]
    with pytest.raises(SharedMemoryNotFoundError, match="cuda shared memory region: 'frames'"):
        regions.status("frames")


def test_fake_cuda_unregister_all_closes_every_region() -> None:
    cuda = FakeCudaIpc()
    regions = CudaRegionRegistry(cuda)
    for name in ("a", "b"):
        regions.register(name, cuda.export(8)[0], 0, 8)
    regions.unregister()
    assert regions.status() == []
    assert cuda.log.count("close") == 2


@pytest.mark.parametrize(
    ("handle", "device_id", "byte_size", "message"),
    [
        (b"short", 0, 8, "64-byte CUDA IPC handle, got 5 bytes"),
        (None, -1, 8, "'device_id' must be an integer >= 0"),
        (None, 0, 0, "'byte_size' must be an integer >= 1"),
        (None, 1, 8, "failed to open CUDA IPC handle: cudaSetDevice: cudaErrorInvalidDevice"),
        (b"\0" * 64, 0, 8, "failed to open CUDA IPC handle: cudaIpcOpenMemHandle"),
    ],
)
def test_fake_cuda_register_refusals(
    handle: bytes | None, device_id: int, byte_size: int, message: str
) -> None:
    cuda = FakeCudaIpc()
    regions = CudaRegionRegistry(cuda)
    with pytest.raises(InvalidInputError, match=message):
        regions.register("r", handle or cuda.export(8)[0], device_id, byte_size)
    with pytest.raises(InvalidInputError, match="'region name' is necessary"):
        regions.register("", cuda.export(8)[0], 0, 8)
    assert regions.status() == []


def test_fake_cuda_region_cap() -> None:
    cuda = FakeCudaIpc()
    regions = CudaRegionRegistry(cuda, max_regions=1)
    regions.register("a", cuda.export(8)[0], 0, 8)
    with pytest.raises(InvalidInputError, match="1 regions are registered already"):
        regions.register("b", cuda.export(8)[0], 0, 8)


def test_fake_cuda_names_unique_across_system_and_cuda_regions() -> None:
    cuda = FakeCudaIpc()
    system = SharedMemoryRegistry()
    regions = CudaRegionRegistry(cuda, taken=lambda n: any(r.name == n for r in system.status()))
    system.device = regions
    regions.register("shared", cuda.export(8)[0], 0, 8)
    with pytest.raises(ConflictError, match="'shared' already in manager"):
        system.register("shared", "/whatever", 0, 8)


def test_fake_cuda_spans_checked_before_any_copy() -> None:
    cuda = FakeCudaIpc()
    regions = CudaRegionRegistry(cuda)
    handle, memory = cuda.export(16)
    memory[:] = bytes(range(16))
    regions.register("r", handle, 0, 16)
    assert bytes(regions.read("r", 4, 4)) == bytes([4, 5, 6, 7])
    regions.write("r", 12, b"\xff" * 4)
    assert memory[12:] == b"\xff" * 4
    cuda.log.clear()
    with pytest.raises(
        InvalidInputError,
        match=r"Invalid offset \+ byte size for shared memory region: 'r' \(offset 8 \+ 9 ",
    ):
        regions.read("r", 8, 9)
    with pytest.raises(
        InvalidInputError, match="Invalid offset for shared memory region: 'r' \\(offset 16"
    ):
        regions.write("r", 16, b"x")
    with pytest.raises(SharedMemoryNotFoundError):
        regions.read("nope", 0, 1)
    assert cuda.log == []


def test_http_register_body_as_tritonclient_sends_it() -> None:
    raw = os.urandom(IPC_HANDLE_SIZE)
    # tritonclient.http sends get_raw_handle()'s base64 bytes as a JSON string.
    doc = {"raw_handle": {"b64": base64.b64encode(raw).decode()}, "device_id": 0, "byte_size": 64}
    assert register_request_from_json(doc) == (raw, 0, 64)
    for bad in (
        {},
        {"raw_handle": "abc", "device_id": 0, "byte_size": 8},
        {"raw_handle": {"b64": "abc"}, "device_id": "0", "byte_size": 8},
    ):
        with pytest.raises(InvalidInputError, match="register request body"):
            register_request_from_json(bad)
    with pytest.raises(InvalidInputError, match="not valid base64"):
        register_request_from_json({"raw_handle": {"b64": "abc"}, "device_id": 0, "byte_size": 8})
    # Outside the alphabet is skipped, as tritonclient's gRPC client decodes; the registry then
    # refuses a handle that is not 64 bytes.
    doc = {"raw_handle": {"b64": "%%%"}, "device_id": 0, "byte_size": 8}
    assert register_request_from_json(doc) == (b"", 0, 8)


@pytest.fixture
def fake_cuda_agent(agent: RunningAgent) -> Iterator[tuple[RunningAgent, FakeCudaIpc]]:
    """The shared agent with fake CUDA regions in its shared-memory registry."""
    cuda = FakeCudaIpc()
    system = agent.dataplane.shared_memory
    previous = system.device
    system.device = CudaRegionRegistry(cuda)
    try:
        yield agent, cuda
    finally:
        system.device = previous


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fake_cuda_infer_from_and_into_device_regions_equals_host_path(
    fake_cuda_agent: tuple[RunningAgent, FakeCudaIpc], protocol: str
) -> None:
    agent, cuda = fake_cuda_agent
    regions = agent.dataplane.shared_memory.device
    assert isinstance(regions, CudaRegionRegistry)
    lib = httpclient if protocol == "http" else grpcclient
    port = agent.http_port if protocol == "http" else agent.grpc_port
    client = lib.InferenceServerClient(f"127.0.0.1:{port}")
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    in_handle, in_memory = cuda.export(64 * 1024)
    out_handle, out_memory = cuda.export(4096)
    in_memory[256 : 256 + x.nbytes] = x.tobytes()  # what the camera pipeline wrote
    try:
        # tritonclient takes the handle as cudashm.get_raw_handle gives it: base64 bytes.
        client.register_cuda_shared_memory("cam_in", base64.b64encode(in_handle), 0, 64 * 1024)
        client.register_cuda_shared_memory("cam_out", base64.b64encode(out_handle), 0, 4096)
        plain = lib.InferInput("INPUT0", [4, 64], "FP32")
        plain.set_data_from_numpy(x)
        expected = client.infer("mlp_classifier", [plain]).as_numpy("OUTPUT0")

        inp = lib.InferInput("INPUT0", [4, 64], "FP32")
        inp.set_shared_memory("cam_in", x.nbytes, offset=256)
        out = lib.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("cam_out", 1024, offset=128)
        result = client.infer("mlp_classifier", [inp], outputs=[out])
        meta = result.get_output("OUTPUT0")  # name, datatype and shape; the bytes are on the GPU
        shape = meta["shape"] if isinstance(meta, dict) else list(meta.shape)
        assert [int(d) for d in shape] == list(expected.shape)
        got = np.frombuffer(out_memory, np.float32, expected.size, offset=128)
        np.testing.assert_array_equal(got.reshape(expected.shape), expected)
        assert f"read 256 {x.nbytes}" in cuda.log
        assert f"write 128 {expected.nbytes}" in cuda.log

        past = lib.InferInput("INPUT0", [4, 64], "FP32")
        past.set_shared_memory("cam_in", x.nbytes, offset=64 * 1024 - 8)
        with pytest.raises(InferenceServerException, match="Invalid offset"):
            client.infer("mlp_classifier", [past])
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
    assert regions.status() == []


def cuda_status(client: Any, name: str = "") -> dict[str, tuple[int, int]]:
    """{region: (device id, byte size)} from tritonclient's CUDA status, HTTP or gRPC."""
    if isinstance(client, httpclient.InferenceServerClient):
        doc = client.get_cuda_shared_memory_status(name)
        return {r["name"]: (r["device_id"], r["byte_size"]) for r in doc}
    reply = client.get_cuda_shared_memory_status(name)
    return {r.name: (r.device_id, r.byte_size) for r in reply.regions.values()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fake_cuda_register_status_unregister_through_tritonclient(
    fake_cuda_agent: tuple[RunningAgent, FakeCudaIpc], protocol: str
) -> None:
    agent, cuda = fake_cuda_agent
    lib: Any = httpclient if protocol == "http" else grpcclient
    port = agent.http_port if protocol == "http" else agent.grpc_port
    client = lib.InferenceServerClient(f"127.0.0.1:{port}")
    frames, _ = cuda.export(1024)
    masks, _ = cuda.export(512)
    try:
        client.register_cuda_shared_memory("frames", base64.b64encode(frames), 0, 1024)
        client.register_cuda_shared_memory("masks", base64.b64encode(masks), 0, 512)
        assert cuda.log == ["open 1024", "open 512"]  # each handle opened once, at register
        assert cuda_status(client) == {"frames": (0, 1024), "masks": (0, 512)}
        assert cuda_status(client, "masks") == {"masks": (0, 512)}
        metadata = client.get_server_metadata()
        extensions = metadata["extensions"] if protocol == "http" else metadata.extensions
        assert "cuda_shared_memory" in extensions

        for name, handle, device, message in (
            ("frames", frames, 0, "'frames' already in manager"),
            ("short", b"x" * 8, 0, "64-byte CUDA IPC handle, got 8 bytes"),
            ("gpu1", masks, 1, "failed to open CUDA IPC handle: cudaSetDevice"),
        ):
            with pytest.raises(InferenceServerException, match=message):
                client.register_cuda_shared_memory(name, base64.b64encode(handle), device, 8)
        assert set(cuda_status(client)) == {"frames", "masks"}

        client.unregister_cuda_shared_memory("frames")
        client.unregister_cuda_shared_memory("never-registered")  # not an error, as in Triton
        assert cuda.log[-1] == "close"
        assert cuda_status(client) == {"masks": (0, 512)}
        with pytest.raises(InferenceServerException, match="cuda shared memory region: 'frames'"):
            client.get_cuda_shared_memory_status("frames")
        client.unregister_cuda_shared_memory()
        assert cuda_status(client) == {}
        assert cuda.log.count("close") == 2
    finally:
        client.unregister_cuda_shared_memory()
        client.close()
