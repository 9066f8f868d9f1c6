"""Memory in flight on every door: a request whose bytes do not fit in the memory budget's pool
for requests in flight is refused before its body is read (HTTP 503, both doors; gRPC
RESOURCE_EXHAUSTED), bodies being read together are bounded by the pool, and every byte held is
given back. Real agents, real sockets; each wait is a bounded poll on the agent's own figures.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.models.inflight import InflightBytes
from agent.runtime.daemon import RunningAgent
from tests.server import running_agent
from tests.support import MLP_X, http_get, infer_mlp, wait_until

pytestmark = pytest.mark.e2e  # whole agents in threads

MIB = 1 << 20
POOL = 2 * MIB
MODEL = "mlp_classifier"


@pytest.fixture(scope="module", params=[True, False], ids=["lane", "aiohttp"])
def agent(request: pytest.FixtureRequest, model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(
            http_port=0, grpc_port=0, metrics_port=-1, http_infer_lane=request.param
        ),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1, inflight_memory_bytes=POOL),
    )
    with running_agent(config) as running:
        yield running


def pool_of(agent: RunningAgent) -> InflightBytes:
    ledger = agent.registry.ledger
    assert ledger is not None
    assert ledger.inflight is not None
    return ledger.inflight


def head(length: int, *, binary: bool = False) -> bytes:
    extra = "Inference-Header-Content-Length: 2\r\n" if binary else ""
    return (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\n{extra}Content-Length: {length}\r\n\r\n"
    ).encode()


def answer(sock: socket.socket) -> tuple[int, dict[str, object], bytes]:
    """Status, error document (or {}) and head of the one answer on `sock`, read to its end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":", 1)[1]
            for line in raw_head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    status = int(raw_head.split(b" ", 2)[1])
    doc = json.loads(body) if status != 200 else {}
    return status, doc, raw_head


def connect(agent: RunningAgent) -> socket.socket:
    return socket.create_connection(("127.0.0.1", agent.http_port), timeout=30)


def test_a_json_body_that_would_not_fit_is_refused_503_before_it_is_sent(
    agent: RunningAgent,
) -> None:
    with connect(agent) as sock:
        sock.sendall(head(MIB))  # 3 MiB to decode: more than the 2 MiB pool; no body sent
        status, doc, raw_head = answer(sock)
        assert status == 503
        assert doc["error"] == (
            "memory budget: a JSON body of 1.0 MiB needs 3.0 MiB while served, more than the "
            "whole in-flight memory of 2.0 MiB (models.inflight_memory_bytes)"
        )
        assert b"Connection: close" in raw_head or b"connection: close" in raw_head.lower()
    assert infer_mlp(agent.http_port, MODEL)[1].shape == (10,)  # others are served
    wait_until(lambda: pool_of(agent).held_bytes == 0, "every hold given back")


def test_bodies_being_read_together_are_bounded_by_the_pool(agent: RunningAgent) -> None:
    pool = pool_of(agent)
    first_length = 600 * 1024  # 1.8 MiB held as JSON
    with connect(agent) as first, connect(agent) as second:
        first.sendall(head(first_length) + b"{")  # its body begins, and stalls
        wait_until(lambda: pool.held_bytes == 3 * first_length, "the first body held")
        second.sendall(head(200 * 1024))  # 0.6 MiB more: over the pool while the first reads
        status, doc, _ = answer(second)
        assert status == 503
        assert "0.2 MiB of the 2.0 MiB in-flight memory is free now; retry later" in str(
            doc["error"]
        )
        first.sendall(b" " * (first_length - 2) + b"}")  # the rest: a request without inputs
        status, doc, _ = answer(first)
        assert status == 400, doc
    wait_until(lambda: pool.held_bytes == 0, "every hold given back")
    assert infer_mlp(agent.http_port, MODEL)[1].shape == (10,)


def test_a_binary_body_is_held_at_twice_its_size(agent: RunningAgent) -> None:
    pool = pool_of(agent)
    length = 900 * 1024  # 1.76 MiB held as binary (2.6 MiB as JSON would not fit)
    with connect(agent) as sock:
        sock.sendall(head(length, binary=True) + b"{}")
        wait_until(lambda: pool.held_bytes == 2 * length, "the binary body held")
        sock.sendall(b"\0" * (length - 2))
        status, _, _ = answer(sock)
        assert status == 400
    wait_until(lambda: pool.held_bytes == 0, "given back")


def test_a_grpc_message_that_would_not_fit_is_resource_exhausted(agent: RunningAgent) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    try:
        rows = np.repeat(MLP_X, 4096, axis=0)  # a 1 MiB tensor: 2 MiB held, with the message
        big = grpcclient.InferInput("INPUT0", list(rows.shape), "FP32")
        big.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [big])
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "memory budget: a request message of 1.0 MiB needs 2.0 MiB" in str(
            refused.value.message()
        )
        small = grpcclient.InferInput("INPUT0", list(MLP_X.shape), "FP32")
        small.set_data_from_numpy(MLP_X)
        result = client.infer(MODEL, [small])
        assert result.as_numpy("OUTPUT0") is not None
    finally:
        client.close()
    wait_until(lambda: pool_of(agent).held_bytes == 0, "every hold given back")


def test_the_status_document_shows_the_pool(agent: RunningAgent) -> None:
    code, body = http_get(f"http://127.0.0.1:{agent.http_port}/v2/status")
    assert code == 200
    memory = json.loads(body)["memory"]
    assert memory["inflight_capacity_bytes"] == POOL
    assert {"inflight_bytes", "inflight_peak_bytes", "inflight_refused"} <= set(memory)
