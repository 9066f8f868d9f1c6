"""An ensemble with a decoupled step, as Triton runs it: each response of the decoupled Python
step (`tests.decoupled_models`) flows through the ONNX step after it, and the ensemble, decoupled
itself, streams one response per upstream response (gRPC ModelStreamInfer, HTTP
generate_stream); `/infer` refuses it as it refuses any decoupled model.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, LogConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.models import save_ready, write_model
from tests.python_models import write_python_model
from tests.server import running_agent
from tests.support import wait_until

TIMES_TEN_CONFIG = """
name: "times_ten" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

ENSEMBLE = """
name: "stream_pipeline" platform: "ensemble" max_batch_size: 8
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "ERROR_AT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step { model_name: "streamer" model_version: -1
         input_map { key: "N" value: "N" } input_map { key: "MODE" value: "MODE" }
         input_map { key: "ERROR_AT" value: "ERROR_AT" }
         output_map { key: "OUT" value: "index" } }
  step { model_name: "times_ten" model_version: -1
         input_map { key: "X" value: "index" } output_map { key: "Y" value: "Y" } }
}
"""


def times_ten_model() -> onnx.ModelProto:
    """Y = float(X) * 10, batched [-1, 1]."""
    ten = helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0])
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["X"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["xf", "ten"], ["Y"]),
        ],
        "times_ten",
        [helper.make_tensor_value_info("X", TensorProto.INT32, [None, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [ten],
    )
    return save_ready(graph)


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def agent(
    tmp_path_factory: pytest.TempPathFactory, markers: Path, trace_dir: Path
) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, "streamer", DECOUPLED_MODEL, decoupled_config("streamer", markers))
    write_model(repo, "times_ten", times_ten_model(), TIMES_TEN_CONFIG)
    (repo / "stream_pipeline" / "1").mkdir(parents=True)
    (repo / "stream_pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
        log=LogConfig(trace_file=trace_dir / "trace.json"),
    )
    with running_agent(config) as running:
        yield running


def grpc_inputs(n: int, mode: int = 0, error_at: int = -1) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in (("N", n), ("MODE", mode), ("ERROR_AT", error_at)):
        tensor = grpcclient.InferInput(name, [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        tensors.append(tensor)
    return tensors


def stream(
    agent: RunningAgent, n: int, mode: int = 0, error_at: int = -1, *, stop_after: int = -1
) -> list[Any]:
    """One request on a gRPC stream: each response's Y (or error text) until the final flag
    (or `stop_after` responses: the stream is then closed, cancelling the request)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    messages: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: messages.put(error or result))
    got: list[Any] = []
    try:
        client.async_stream_infer(
            "stream_pipeline",
            grpc_inputs(n, mode, error_at),
            request_id="r",
            enable_empty_final_response=True,
        )
        while True:
            message = messages.get(timeout=30)
            if isinstance(message, InferenceServerException):
                got.append(message.message())
                break
            response = message.get_response()
            y = message.as_numpy("Y")
            if y is not None:
                got.append(float(y.flat[0]))
            if response.parameters["triton_final_response"].bool_param or len(got) == stop_after:
                break
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return got


@pytest.mark.parametrize("mode", [0, 1])  # the final flag alone, or with the last response
def test_each_response_of_the_decoupled_step_flows_through_the_next(
    agent: RunningAgent, mode: int
) -> None:
    assert stream(agent, 4, mode) == [0.0, 10.0, 20.0, 30.0]


def test_no_response_upstream_gives_just_the_final_flag(agent: RunningAgent) -> None:
    assert stream(agent, 0) == []


def test_an_error_response_upstream_ends_the_request_with_the_step_named(
    agent: RunningAgent,
) -> None:
    got = stream(agent, 4, error_at=2)
    assert got[:2] == [0.0, 10.0]
    assert len(got) == 3
    assert "ensemble 'stream_pipeline' step 0 (model 'streamer'): " in got[2]
    assert "response 2 failed" in got[2]


def test_the_ensemble_is_decoupled_over_http(agent: RunningAgent) -> None:
    base = f"http://127.0.0.1:{agent.http_port}/v2/models/stream_pipeline"

    async def main() -> tuple[list[Any], tuple[int, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{base}/generate_stream", json={"N": 3, "MODE": 0, "ERROR_AT": -1}
            ) as got:
                events = [
                    json.loads(line[len(b"data: ") :])
                    async for line in got.content
                    if line.startswith(b"data: ")
                ]
            async with session.get(f"{base}/config") as got:
                config = await got.json()
            body = {
                "inputs": [
                    {"name": n, "shape": [1, 1], "datatype": "INT32", "data": [1]}
                    for n in ("N", "MODE", "ERROR_AT")
                ]
            }
            async with session.post(f"{base}/infer", json=body) as got:
                refused = (got.status, await got.json())
        return events, refused, config

    events, refused, config = asyncio.run(main())
    assert [event["Y"] for event in events] == [0.0, 10.0, 20.0]
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert refused == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )
    with httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}") as client:
        stats = client.get_inference_statistics("times_ten")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] >= 3  # each response ran a step


def test_closing_the_stream_cancels_the_decoupled_step(agent: RunningAgent, markers: Path) -> None:
    # MODE 2 streams until its request is cancelled, then writes `cancelled-<N>`.
    got = stream(agent, 77, mode=2, stop_after=2)
    assert got == [0.0, 10.0]
    wait_until((markers / "cancelled-77").exists, "the decoupled step to see is_cancelled()")


def test_a_streamed_request_is_traced_with_its_steps_as_children(
    agent: RunningAgent, trace_dir: Path
) -> None:
    tracer = agent.dataplane.tracer
    keys = ("trace_level", "trace_rate", "log_frequency")
    tracer.update(None, dict(zip(keys, (["TIMESTAMPS"], "1", "1"), strict=True)))
    try:
        assert stream(agent, 2) == [0.0, 10.0]
    finally:
        tracer.update(None, dict.fromkeys(keys))
        tracer.flush()
    heads: dict[int, dict[str, Any]] = {}
    stamps: dict[int, list[str]] = {}
    for path in trace_dir.iterdir():
        for entry in json.loads(path.read_text()):
            if "timestamps" in entry:
                stamps.setdefault(entry["id"], []).extend(t["name"] for t in entry["timestamps"])
            elif "model_name" in entry:
                heads[entry["id"]] = entry
    (top,) = [i for i, h in heads.items() if h["model_name"] == "stream_pipeline"]
    assert stamps[top][0] == "REQUEST_START"
    assert stamps[top].count("INFER_RESPONSE_COMPLETE") == 2  # one per ensemble response
    assert stamps[top][-1] == "REQUEST_END"
    children = sorted(h["model_name"] for h in heads.values() if h.get("parent_id") == top)
    assert children == ["streamer", "times_ten", "times_ten"]
    (step,) = [i for i, h in heads.items() if h["model_name"] == "streamer"]
    assert stamps[step].count("INFER_RESPONSE_COMPLETE") == 2
