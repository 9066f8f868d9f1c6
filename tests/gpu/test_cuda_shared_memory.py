"""CUDA shared memory on a real GPU: tritonclient's `cuda_shared_memory` regions (device memory
exported with a CUDA IPC handle) registered over HTTP and gRPC; inputs read from and outputs
written to GPU memory equal the host-memory request's. The agent runs in its own process: CUDA
does not open an IPC handle in the process that exported it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from agent.runtime.demo import write_demo_repository
from tests.support import free_port, wait_listening

pytestmark = pytest.mark.needs_cuda

Client = Any  # httpclient or grpcclient InferenceServerClient


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(HTTP, gRPC) ports of an agent serving the demo repository in a child process."""
    repo = write_demo_repository(tmp_path_factory.mktemp("cuda") / "models")
    grpc_port = free_port()
    command = [sys.executable, "-m", "agent", "serve", "--model-repository", str(repo)]
    command += ["--http-port", "0", "--grpc-port", str(grpc_port), "--metrics-port", "-1"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        yield wait_listening(proc), grpc_port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, ports: tuple[int, int]) -> Iterator[Client]:
    http_port, grpc_port = ports
    if request.param == "http":
        client: Client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    yield client
    client.unregister_cuda_shared_memory()
    client.close()


def _names(client: Client) -> dict[str, int]:
    """{region name: byte size} from the CUDA status, for both clients."""
    if isinstance(client, httpclient.InferenceServerClient):
        return {r["name"]: int(r["byte_size"]) for r in client.get_cuda_shared_memory_status()}
    doc = client.get_cuda_shared_memory_status(as_json=True)
    return {r["name"]: int(r["byte_size"]) for r in doc.get("regions", {}).values()}


def test_infer_through_gpu_memory_equals_host_memory(client: Client) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    lib = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    x = np.random.default_rng(11).standard_normal((8, 64)).astype(np.float32)
    plain = lib.InferInput("INPUT0", list(x.shape), "FP32")
    plain.set_data_from_numpy(x)
    expected = client.infer("mlp_classifier", [plain]).as_numpy("OUTPUT0")

    in_region = cudashm.create_shared_memory_region("gpu_in", x.nbytes, 0)
    out_region = cudashm.create_shared_memory_region("gpu_out", expected.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(in_region, [x])
        client.register_cuda_shared_memory("gpu_in", cudashm.get_raw_handle(in_region), 0, x.nbytes)
        client.register_cuda_shared_memory(
            "gpu_out", cudashm.get_raw_handle(out_region), 0, expected.nbytes
        )
        assert _names(client) == {"gpu_in": x.nbytes, "gpu_out": expected.nbytes}

        inp = lib.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_shared_memory("gpu_in", x.nbytes)
        out = lib.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("gpu_out", expected.nbytes)
        client.infer("mlp_classifier", [inp], outputs=[out])
        got = cudashm.get_contents_as_numpy(out_region, np.float32, list(expected.shape))
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        print(f"CUDA shm {type(client).__module__}: {got.shape} equal to host-memory result")

        client.unregister_cuda_shared_memory("gpu_in")
        assert _names(client) == {"gpu_out": expected.nbytes}
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(in_region)
        cudashm.destroy_shared_memory_region(out_region)
    assert _names(client) == {}


def test_register_refuses_a_handle_that_is_not_one(client: Client) -> None:
    import base64

    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="CUDA IPC handle"):
        client.register_cuda_shared_memory("bad", base64.b64encode(b"\0" * 64), 0, 64)
    assert _names(client) == {}
