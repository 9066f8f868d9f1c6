"""ModelStreamInfer's memory (`agent.api.grpc.service`), over a stand-in data plane: a model's
answers wait once 16 are made ahead of the engine taking them, and a request that does not fit
in the memory in flight is answered on the stream, which goes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from agent.api.grpc.service import InferenceService
from agent.models.inflight import InflightBytes
from agent.proto import grpc_service_pb2 as pb
from agent.serving.response_stream import StreamedResponse
from agent.tensors.request import InferResponse, OutputTensor
from agent.tracing.tracer import Tracer


class TalkativeDataPlane:
    """A decoupled model that answers each request `answers` times, counting what it made."""

    def __init__(self, answers: int, inflight: InflightBytes | None = None) -> None:
        self.answers = answers
        self.made = 0
        self.inflight = inflight
        self.tracer = Tracer()

    def scrub(self, message: str) -> str:
        return message

    async def infer_stream(
        self, model: str, version: str | None, request: Any
    ) -> AsyncIterator[StreamedResponse]:
        out = OutputTensor("Y", "FP32", np.zeros(4, dtype=np.float32))
        for i in range(self.answers):
            self.made += 1
            yield StreamedResponse(InferResponse(model, "1", (out,)), final=i == self.answers - 1)


def request_bytes(rows: int = 1) -> bytes:
    message = pb.ModelInferRequest(model_name="talk")
    message.inputs.add(name="X", datatype="FP32", shape=[rows])
    message.raw_input_contents.append(np.zeros(rows, np.float32).tobytes())
    return message.SerializeToString()


class Peer:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


async def requests(*messages: bytes, hold: asyncio.Event) -> AsyncIterator[bytes]:
    for message in messages:
        yield message
    await hold.wait()  # the client keeps its side open


def test_a_models_answers_wait_for_the_engine_past_sixteen() -> None:
    async def scenario() -> tuple[int, int]:
        dp = TalkativeDataPlane(answers=1000)
        service = InferenceService(dp)  # type: ignore[arg-type]
        hold = asyncio.Event()
        stream = service.ModelStreamInfer(requests(request_bytes(), hold=hold), Peer())
        first = await anext(stream)
        assert first.infer_response.model_name == "talk"
        for _ in range(50):  # the model runs as far as the stream lets it
            await asyncio.sleep(0)
        stalled = dp.made
        for _ in range(100):
            await anext(stream)
        for _ in range(50):
            await asyncio.sleep(0)
        moved = dp.made
        hold.set()
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator
        return stalled, moved

    stalled, moved = asyncio.run(scenario())
    assert stalled <= 1 + 16 + 1  # the one taken, the room, the one waiting for room
    assert 101 <= moved <= 101 + 16 + 1


def test_a_stream_request_over_the_memory_in_flight_is_answered_and_the_stream_goes_on() -> None:
    async def scenario() -> list[pb.ModelStreamInferResponse]:
        pool = InflightBytes(64 * 1024)
        dp = TalkativeDataPlane(answers=1, inflight=pool)
        service = InferenceService(dp)  # type: ignore[arg-type]
        hold = asyncio.Event()
        big, small = request_bytes(rows=32 * 1024), request_bytes()
        stream = service.ModelStreamInfer(requests(big, small, hold=hold), Peer())
        answers = [await anext(stream), await anext(stream)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert pool.held_bytes == 0  # the small one's hold given back with its last answer
        hold.set()
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator
        return answers

    refused, served = asyncio.run(scenario())
    assert refused.error_message.startswith(
        "memory budget: a request message of 0.1 MiB needs 0.3 MiB while served, more than the "
        "whole in-flight memory of 0.1 MiB"
    )
    assert served.infer_response.model_name == "talk"
    assert not served.error_message
