"""Decoupled Python models over gRPC: ModelStreamInfer with Triton's own clients.

A real agent serves `tests.decoupled_models.DECOUPLED_MODEL`; tritonclient's gRPC client
opens the streams (many at once, one client each).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.python_models import write_python_model
from tests.server import running_agent
from tests.support import wait_until

MODEL = "streamer"


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, markers: Path) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, MODEL, DECOUPLED_MODEL, decoupled_config(MODEL, markers))
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def url(agent: RunningAgent) -> str:
    assert agent.grpc_port is not None
    return f"127.0.0.1:{agent.grpc_port}"


def inputs(module: Any, n: int, mode: int = 0, error_at: int = -1) -> list[Any]:
    tensors = []
    for name, value in (("N", n), ("MODE", mode), ("ERROR_AT", error_at)):
        tensor = module.InferInput(name, [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        tensors.append(tensor)
    return tensors


def request(n: int, request_id: str, *, mode: int = 0, error_at: int = -1) -> dict[str, Any]:
    return {
        "model_name": MODEL,
        "inputs": inputs(grpcclient, n, mode, error_at),
        "request_id": request_id,
        "enable_empty_final_response": True,
    }


Got = dict[str, list[tuple[Any, bool]]]


def collect(url: str, requests: list[dict[str, Any]], until: set[str] | None = None) -> Got:
    """Send `requests` on one stream; every message per request id: (OUT value, or the error
    text, and triton_final_response). Ends (closing the stream, which cancels what still runs)
    when every request, or those in `until`, got its final flag."""
    client = grpcclient.InferenceServerClient(url)
    messages: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: messages.put(error or result))
    got: Got = {r["request_id"]: [] for r in requests}
    open_ids = set(got) if until is None else set(until)
    try:
        for r in requests:
            client.async_stream_infer(**r)
        while open_ids:
            message = messages.get(timeout=30)
            if isinstance(message, InferenceServerException):
                # An error message carries no request id: tests send one request then.
                (only,) = got
                got[only].append((message.message(), False))
                continue
            response = message.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out = message.as_numpy("OUT")
            got[response.id].append((None if out is None else int(out.flat[0]), final))
            if final:
                open_ids.discard(response.id)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return got


def test_twenty_concurrent_streams_each_get_n_responses_in_order(url: str) -> None:
    with ThreadPoolExecutor(20) as pool:
        streams = list(pool.map(lambda k: collect(url, [request(5 + k % 3, f"s{k}")]), range(20)))
    for k, got in enumerate(streams):
        n = 5 + k % 3
        assert got[f"s{k}"] == [*((i, False) for i in range(n)), (None, True)], k


def test_requests_on_one_stream_run_concurrently(url: str, markers: Path) -> None:
    # The first request streams until cancelled: the others finish only if the stream serves
    # them meanwhile; closing the stream then cancels the first.
    requests = [request(42, "endless", mode=2), *(request(3, f"r{k}") for k in range(5))]
    got = collect(url, requests, until={f"r{k}" for k in range(5)})
    for k in range(5):
        assert got[f"r{k}"] == [(0, False), (1, False), (2, False), (None, True)], k
    assert got["endless"][:2] == [(0, False), (1, False)] or len(got["endless"]) < 2
    wait_until((markers / "cancelled-42").exists, "the model to see the cancellation")


def test_execute_may_stream_several_requests_itself(url: str) -> None:
    got = collect(url, [request(3, f"e{k}", mode=1) for k in range(6)])
    for k in range(6):
        assert got[f"e{k}"] == [(0, False), (1, False), (2, True)], k


def test_zero_responses_then_the_empty_final_response(url: str) -> None:
    got = collect(url, [request(0, "zero")])
    assert got == {"zero": [(None, True)]}


def test_an_error_mid_stream_and_the_stream_goes_on(url: str) -> None:
    got = collect(url, [request(4, "err", error_at=2)])["err"]
    assert got[:2] == [(0, False), (1, False)]
    assert "response 2 failed" in str(got[2][0])
    assert got[3:] == [(3, False), (None, True)]


def test_returning_responses_from_execute_is_triton_s_error(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    messages: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: messages.put(error or result))
    try:
        client.async_stream_infer(**request(1, "ret", mode=3))
        error = messages.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(error, InferenceServerException)
    assert error.message() == (
        f"Python model '{MODEL}' is using the decoupled mode and the execute function must "
        "return None."
    )


def test_without_the_empty_final_option_the_lone_final_flag_is_not_sent(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer(MODEL, inputs(grpcclient, 2), request_id="plain")
        client.async_stream_infer(MODEL, inputs(grpcclient, 1, mode=1), request_id="last")
        seen = [results.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    flags = {
        (r.get_response().id, int(r.as_numpy("OUT").flat[0])): r.get_response()
        .parameters["triton_final_response"]
        .bool_param
        for r in seen
    }
    # "plain" sends its final flag alone: not sent; "last" sends it with its response.
    assert flags == {("plain", 0): False, ("plain", 1): False, ("last", 0): True}
    assert results.empty()


def test_a_cancelled_stream_stops_the_model_loop(url: str, markers: Path) -> None:
    client = grpcclient.InferenceServerClient(url)
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer(MODEL, inputs(grpcclient, 41, mode=2), request_id="forever")
        first = results.get(timeout=30)
        assert int(first.as_numpy("OUT").flat[0]) == 0
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    wait_until((markers / "cancelled-41").exists, "the model to see the cancellation")


def test_unary_infer_is_refused_with_triton_s_message(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(MODEL, inputs(grpcclient, 1))
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(
        caught.value
    )


def test_statistics_count_requests_and_responses(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    before = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    collect(url, [request(3, "stats")])
    after = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    assert _successes(after) == _successes(before) + 1
    responses = after["response_stats"]
    assert int(responses["0"]["success"]["count"]) >= 1
    assert int(responses["3"]["empty_response"]["count"]) >= 1


def _successes(stats: dict[str, Any]) -> int:
    return int(stats["inference_stats"]["success"].get("count", 0))
