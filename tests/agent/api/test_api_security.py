"""The local API off loopback, end to end: restricted API groups over HTTP and gRPC, TLS and
mutual TLS with tritonclient, shared-memory registration for local clients only."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from agent.api.access import CONTROL_GROUPS, GROUPS
from agent.api.tls import ServerTls, TlsError, TlsFiles
from agent.cli.commands import main
from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.proto import grpc_service_pb2_grpc as pb_grpc
from agent.runtime.daemon import RunningAgent
from agent.runtime.reload import Reloader
from model_cache import ModelCache
from tests.models import scale_model, write_versions
from tests.server import running_agent
from tests.tls_certs import Pem, TestPki, served_serial

X = np.arange(4, dtype=np.float32).reshape(1, 4)

# One request per group that succeeds once let through: (method, path, body).
HTTP_CALLS: dict[str, tuple[str, str, bytes | None]] = {
    "health": ("GET", "/v2/health/ready", None),
    "metadata": ("GET", "/v2/models/s", None),
    "inference": (
        "POST",
        "/v2/models/s/infer",
        json.dumps(
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": X.tolist()}]}
        ).encode(),
    ),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status", None),
    "model-config": ("GET", "/v2/models/s/config", None),
    "model-repository": ("POST", "/v2/repository/index", b"{}"),
    "statistics": ("GET", "/v2/models/stats", None),
    "trace": ("GET", "/v2/trace/setting", None),
    "logging": ("GET", "/v2/logging", None),
    "cache": ("GET", "/v2/repository/models/s/versions", None),
    "status": ("GET", "/v2/status", None),
    "canary": ("GET", "/v2/models/s/canary", None),
}


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="s")
    request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(X.tobytes())
    return request


GRPC_CALLS: dict[str, tuple[str, Any]] = {
    "health": ("ServerReady", pb.ServerReadyRequest()),
    "metadata": ("ServerMetadata", pb.ServerMetadataRequest()),
    "inference": ("ModelInfer", _infer_request()),
    "shared-memory": ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
    "model-config": ("ModelConfig", pb.ModelConfigRequest(name="s")),
    "model-repository": ("RepositoryIndex", pb.RepositoryIndexRequest()),
    "statistics": ("ModelStatistics", pb.ModelStatisticsRequest()),
    "trace": ("TraceSetting", pb.TraceSettingRequest()),
    "logging": ("LogSettings", pb.LogSettingsRequest()),
}
GRPC_GROUPS = sorted(GRPC_CALLS)  # cache and canary have no gRPC method


def _key(group: str) -> tuple[str, str]:
    return f"key-{group}", f"value-{group}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository serving "s" (FP32 [1, 4] -> X * 2)."""
    root = tmp_path_factory.mktemp("security") / "models"
    write_versions(root, "s", {1: scale_model(2.0)})
    return root


@pytest.fixture(scope="module")
def cache_dir(repo: Path) -> Path:
    """A model cache serving "s", version 1 active (the cache group needs one)."""
    with ModelCache(repo.parent / "cache") as cache:
        cache.install("s", 1, repo / "s")
        cache.activate("s", 1)
    return repo.parent / "cache"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def restricted(cache_dir: Path) -> Iterator[RunningAgent]:
    """Every group restricted, each with its own key and value."""
    http = tuple("{}:{}={}".format(g, *_key(g)) for g in GROUPS)
    config = AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=0,
            metrics_port=-1,
            http_restricted_api=http,
            grpc_restricted_protocol=tuple(s for s in http if s.split(":")[0] in GRPC_CALLS),
        ),
        models=ModelsConfig(intra_op_threads=1),
        cache=CacheConfig(dir=cache_dir),
    )
    with running_agent(config) as agent:
        yield agent


def _http(port: int, group: str, headers: dict[str, str]) -> tuple[int, bytes]:
    method, path, body = HTTP_CALLS[group]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize("group", GROUPS)
def test_http_group_refused_without_its_header_and_served_with_it(
    restricted: RunningAgent, group: str
) -> None:
    key, value = _key(group)
    status, body = _http(restricted.http_port, group, {})
    assert status == 403
    assert json.loads(body) == {"error": f"This API is restricted, expecting header '{key}'"}
    other = _key("inference" if group != "inference" else "health")
    assert _http(restricted.http_port, group, {other[0]: other[1]})[0] == 403
    status, body = _http(restricted.http_port, group, {key: value})
    assert status == 200, body


@pytest.mark.parametrize("group", GRPC_GROUPS)
def test_grpc_group_refused_without_its_header_and_served_with_it(
    restricted: RunningAgent, group: str
) -> None:
    method, request = GRPC_CALLS[group]
    key, value = _key(group)
    with grpc.insecure_channel(f"127.0.0.1:{restricted.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        call = getattr(stub, method)
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == (
            f"This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'"
        )
        call(request, timeout=30, metadata=[(f"triton-grpc-protocol-{key}", value)])


def test_grpc_stream_inference_is_refused_without_its_header(restricted: RunningAgent) -> None:
    key, value = _key("inference")
    with grpc.insecure_channel(f"127.0.0.1:{restricted.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ModelStreamInfer(iter([_infer_request()]), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "expecting header 'triton-grpc-protocol-key-inference'" in str(
            refused.value.details()
        )
        metadata = [(f"triton-grpc-protocol-{key}", value)]
        answers = list(stub.ModelStreamInfer(iter([_infer_request()]), metadata=metadata))
        assert len(answers) == 1
        assert answers[0].error_message == ""


# --- TLS, mutual TLS, and inference open beside restricted control groups ----------------------

ADMIN = ",".join(CONTROL_GROUPS) + ":admin-key=s3cret"


@pytest.fixture(scope="module")
def mutual(repo: Path, pki: TestPki) -> Iterator[tuple[RunningAgent, Pem]]:
    server = pki.server(serial=41)
    config = AgentConfig(
        server=ServerConfig(
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            tls_cert_file=server.cert,
            tls_key_file=server.key,
            tls_client_ca_file=pki.ca.cert,
            http_restricted_api=(ADMIN,),
            grpc_restricted_protocol=(ADMIN,),
        ),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent, pki.client()


def _https(
    agent: RunningAgent, pki: TestPki, client: Pem | None
) -> httpclient.InferenceServerClient:
    options: dict[str, Any] = {"ca_certs": str(pki.ca.cert)}
    if client is not None:
        options.update(certfile=str(client.cert), keyfile=str(client.key))
    return httpclient.InferenceServerClient(
        f"127.0.0.1:{agent.http_port}", ssl=True, ssl_options=options, network_timeout=30
    )


def test_https_with_a_client_certificate_infers_and_control_needs_the_header(
    mutual: tuple[RunningAgent, Pem], pki: TestPki
) -> None:
    agent, client_pem = mutual
    client = _https(agent, pki, client_pem)
    try:
        assert client.is_server_ready()
        tensor = httpclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        result = client.infer("s", [tensor])  # inference: open, no header
        np.testing.assert_array_equal(result.as_numpy("Y"), X * 2)
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            client.get_model_repository_index()
        index = client.get_model_repository_index(headers={"admin-key": "s3cret"})
        assert [m["name"] for m in index] == ["s"]
    finally:
        client.close()


def test_https_without_a_client_certificate_is_refused(
    mutual: tuple[RunningAgent, Pem], pki: TestPki
) -> None:
    agent, _ = mutual
    client = _https(agent, pki, None)
    try:
        with pytest.raises(HTTPConnectionClosed):
            client.is_server_live()
    finally:
        client.close()
    # Under TLS 1.3 the handshake ends before the server checks; then no answer, only a close.
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    with (
        socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        try:
            conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = conn.recv(1024)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            answer = b""
    assert answer == b""


def test_grpc_over_mutual_tls_infers_and_control_needs_the_header(
    mutual: tuple[RunningAgent, Pem], pki: TestPki
) -> None:
    agent, client_pem = mutual
    client = grpcclient.InferenceServerClient(
        f"localhost:{agent.grpc_port}",
        ssl=True,
        root_certificates=str(pki.ca.cert),
        private_key=str(client_pem.key),
        certificate_chain=str(client_pem.cert),
    )
    try:
        tensor = grpcclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_array_equal(client.infer("s", [tensor]).as_numpy("Y"), X * 2)
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
            client.get_model_repository_index()
        index = client.get_model_repository_index(
            headers={"triton-grpc-protocol-admin-key": "s3cret"}
        )
        assert [m.name for m in index.models] == ["s"]
    finally:
        client.close()


def test_grpc_without_a_client_certificate_is_refused(
    mutual: tuple[RunningAgent, Pem], pki: TestPki
) -> None:
    agent, _ = mutual
    client = grpcclient.InferenceServerClient(
        f"localhost:{agent.grpc_port}", ssl=True, root_certificates=str(pki.ca.cert)
    )
    try:
        with pytest.raises(InferenceServerException, match=r"StatusCode\.UNAVAILABLE"):
            client.is_server_live(client_timeout=10)
    finally:
        client.close()


def test_metrics_are_served_over_the_same_tls(
    mutual: tuple[RunningAgent, Pem], pki: TestPki
) -> None:
    agent, _ = mutual
    assert agent.metrics_port is not None
    assert served_serial(agent.metrics_port, pki.ca.cert) == 41
    assert served_serial(agent.http_port, pki.ca.cert) == 41


# --- shared memory: local clients, the agent's own objects -------------------------------------


def _outward_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.fixture(scope="module")
def exposed(repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(host="0.0.0.0", http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent


@pytest.fixture
def shm_object() -> Iterator[str]:
    key = f"edge-agent-sec-{os.getpid()}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm/{key}")


def _register(host: str, port: int, region: str, key: str) -> tuple[int, bytes]:
    body = {"key": f"/{key}", "offset": 0, "byte_size": 64}
    return _post(host, port, f"/v2/systemsharedmemory/region/{region}/register", body)


def _post(host: str, port: int, path: str, doc: dict[str, object]) -> tuple[int, bytes]:
    body = json.dumps(doc).encode()
    url = f"http://{host}:{port}{path}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_shared_memory_registration_is_refused_for_remote_clients(
    exposed: RunningAgent, shm_object: str
) -> None:
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    status, body = _register(address, exposed.http_port, "remote", shm_object)
    assert status == 403
    assert "for local clients only" in json.loads(body)["error"]
    with grpc.insecure_channel(f"{address}:{exposed.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.SystemSharedMemoryRegisterRequest(
            name="remote", key=f"/{shm_object}", offset=0, byte_size=64
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.SystemSharedMemoryRegister(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # CUDA regions too (refused for the peer before any GPU is asked).
        cuda = pb.CudaSharedMemoryRegisterRequest(
            name="remote", raw_handle=bytes(64), device_id=0, byte_size=64
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.CudaSharedMemoryRegister(cuda, timeout=30)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    handle = {"b64": base64.b64encode(bytes(64)).decode()}
    doc = {"raw_handle": handle, "device_id": 0, "byte_size": 64}
    status, body = _post(address, exposed.http_port, "/v2/cudasharedmemory/region/r/register", doc)
    assert status == 403
    assert "for local clients only" in json.loads(body)["error"]
    status, _ = _register("127.0.0.1", exposed.http_port, "local", shm_object)
    assert status == 200
    _http_unregister(exposed.http_port, "local")


def _http_unregister(port: int, region: str) -> None:
    url = f"http://127.0.0.1:{port}/v2/systemsharedmemory/region/{region}/unregister"
    with urllib.request.urlopen(urllib.request.Request(url, data=b""), timeout=30) as r:
        assert r.status == 200


def test_shared_memory_of_another_user_is_refused(exposed: RunningAgent, shm_object: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a /dev/shm object to another user needs root")
    os.chown(f"/dev/shm/{shm_object}", 65534, 65534)
    status, body = _register("127.0.0.1", exposed.http_port, "theirs", shm_object)
    assert status == 403
    assert "belongs to another user" in json.loads(body)["error"]


# --- the swap commands with a header and a client certificate ----------------------------------


def test_activate_command_sends_the_restricted_header(
    restricted: RunningAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{restricted.http_port}"
    assert main(["activate", "s", "1", "--url", url]) == 1
    assert "expecting header 'key-cache'" in capsys.readouterr().err
    assert main(["activate", "s", "1", "--url", url, "--header", "key-cache=value-cache"]) == 0
    assert capsys.readouterr().out == "s now serves version 1\n"


def test_activate_command_over_mutual_tls(
    mutual: tuple[RunningAgent, Pem], pki: TestPki, capsys: pytest.CaptureFixture[str]
) -> None:
    agent, client_pem = mutual
    tls = [
        "--cacert",
        str(pki.ca.cert),
        "--cert",
        str(client_pem.cert),
        "--key",
        str(client_pem.key),
    ]
    url = f"https://localhost:{agent.http_port}"
    assert main(["rollback", "s", "--url", url, *tls, "--header", "admin-key=s3cret"]) == 1
    # Through TLS and the restriction: the agent itself answers (it has no model cache).
    assert "model cache" in capsys.readouterr().err


def test_tls_files_that_do_not_load_name_the_file(tmp_path: Path, pki: TestPki) -> None:
    server = pki.server(serial=5, stem="lone")
    with pytest.raises(TlsError, match=r"cannot read .*missing\.key"):
        ServerTls(TlsFiles(server.cert, tmp_path / "missing.key"))
    other = pki.server(serial=6, stem="other")
    with pytest.raises(TlsError, match=r"cannot load certificate .*lone\.crt"):
        ServerTls(TlsFiles(server.cert, other.key))


def test_a_first_restriction_on_reload_waits_for_a_restart(exposed: RunningAgent) -> None:
    """An agent started unrestricted has no check installed: a reload cannot add one."""
    running = AgentConfig(server=ServerConfig(host="0.0.0.0"))
    restricted_config = AgentConfig(
        server=ServerConfig(host="0.0.0.0", http_restricted_api=("trace:k=v",))
    )
    reloader = Reloader(running, lambda: restricted_config, exposed.registry, access=exposed.access)
    report = asyncio.run(reloader.reload())
    assert report.needs_restart == ("server.http_restricted_api",)
    assert exposed.access is not None
    assert not exposed.access.http
    assert _get_trace(exposed.http_port) == 200


def _get_trace(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/trace/setting", timeout=30) as r:
        return int(r.status)
