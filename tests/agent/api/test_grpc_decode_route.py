"""ModelInfer and ModelStreamInfer decode through one route on both engines, tracing on or off.

The route is `grpc_wire.decode_infer`: a request in the shape clients repeat is decoded from its
plan (`plan_cache_info().planned` counts those), any other is parsed whole; the answer, errors
included, is the same either way and on either engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from agent.api.grpc import wire as grpc_wire
from agent.config.schema import AgentConfig, LogConfig, ModelsConfig, ServerConfig
from agent.proto import grpc_service_pb2 as pb
from agent.runtime.daemon import RunningAgent
from tests.server import running_agent

MODEL = "mlp_classifier"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
NOT_A_MESSAGE = b"\x0a\x05ab"  # field 1, 5 bytes long, 2 bytes there


@pytest.fixture(scope="module", params=["loop", "grpcio"])
def agent(
    request: pytest.FixtureRequest, model_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningAgent]:
    traces = tmp_path_factory.mktemp("traces")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1, grpc_engine=request.param),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
        log=LogConfig(trace_file=traces / "trace.json"),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def channel(agent: RunningAgent) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
        yield channel


@pytest.fixture(params=[False, True], ids=["untraced", "traced"])
def traced(request: pytest.FixtureRequest, agent: RunningAgent) -> Iterator[bool]:
    tracer = agent.dataplane.tracer
    if request.param:
        tracer.update(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    yield bool(request.param)
    tracer.update(None, {"trace_level": None, "trace_rate": None})
    tracer.flush()


def raw_request(value: float, request_id: str = "r") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(np.full((1, 64), value, np.float32).tobytes())
    return message


def typed_request(value: float) -> pb.ModelInferRequest:
    """The same request with typed contents: the fast path declines it."""
    message = pb.ModelInferRequest(model_name=MODEL, id="r")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([value] * 64)
    return message


def infer(channel: grpc.Channel, data: bytes) -> pb.ModelInferResponse:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(INFER)
    return pb.ModelInferResponse.FromString(call(data, timeout=30))


def stream(channel: grpc.Channel, requests: list[bytes]) -> list[pb.ModelStreamInferResponse]:
    call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
    return [pb.ModelStreamInferResponse.FromString(r) for r in call(iter(requests), timeout=30)]


def test_model_infer_takes_the_one_route(
    agent: RunningAgent, channel: grpc.Channel, traced: bool
) -> None:
    before = grpc_wire.plan_cache_info().planned
    planned = infer(channel, raw_request(1.0).SerializeToString())
    assert grpc_wire.plan_cache_info().planned == before + 1  # traced or not
    parsed = infer(channel, typed_request(1.0).SerializeToString())
    assert grpc_wire.plan_cache_info().planned == before + 1  # parsed whole
    assert planned == parsed  # the same answer from either way in
    assert planned.id == "r"
    if traced:
        agent.dataplane.tracer.flush()
        trace_file = Path(agent.dataplane.tracer.trace_file)
        names = {
            stamp["name"]
            for path in trace_file.parent.iterdir()
            for entry in json.loads(path.read_text())
            for stamp in entry.get("timestamps", ())
        }
        assert {"GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"} <= names


def test_model_infer_errors_are_the_same_either_way_in(channel: grpc.Channel) -> None:
    wrong = raw_request(1.0)
    wrong.raw_input_contents[0] = b"\0" * 12
    with pytest.raises(grpc.RpcError) as planned:
        infer(channel, wrong.SerializeToString())
    assert planned.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert planned.value.details() == (
        "input 'INPUT0': binary data is 12 bytes but shape [1, 64] of FP32 needs 256"
    )
    short = typed_request(1.0)
    del short.inputs[0].contents.fp32_contents[1:]
    with pytest.raises(grpc.RpcError) as parsed:
        infer(channel, short.SerializeToString())
    assert parsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "has 1 elements in contents.fp32_contents" in str(parsed.value.details())
    with pytest.raises(grpc.RpcError) as broken:
        infer(channel, NOT_A_MESSAGE)
    assert broken.value.code() == grpc.StatusCode.INTERNAL
    assert broken.value.details() == "Exception deserializing request!"


def test_stream_requests_take_the_same_route(channel: grpc.Channel) -> None:
    before = grpc_wire.plan_cache_info().planned
    wrong = raw_request(2.0, "bad")
    wrong.raw_input_contents[0] = b"\0" * 12
    replies = stream(
        channel,
        [
            raw_request(2.0, "planned").SerializeToString(),
            typed_request(2.0).SerializeToString(),
            wrong.SerializeToString(),
        ],
    )
    assert grpc_wire.plan_cache_info().planned == before + 1
    answers = {r.infer_response.id: r.infer_response for r in replies if not r.error_message}
    errors = [r.error_message for r in replies if r.error_message]
    assert set(answers) == {"planned", "r"}
    assert answers["planned"].raw_output_contents == answers["r"].raw_output_contents
    # An invalid request is its own error message; the stream went on.
    assert errors == ["input 'INPUT0': binary data is 12 bytes but shape [1, 64] of FP32 needs 256"]


def test_bytes_that_are_no_request_end_the_stream_on_both_engines(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as broken:
        stream(channel, [NOT_A_MESSAGE])
    assert broken.value.code() == grpc.StatusCode.INTERNAL
    assert broken.value.details() == "Exception deserializing request!"
