"""Batches stay within the bytes the model's memory plan allows one execution: a request over it
is refused, queued requests are split into several batches (real ONNX Runtime session)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from agent.backends.onnx import OnnxBackend
from agent.errors import PayloadTooLargeError
from agent.proto import model_config_pb2 as mc
from agent.runtime.demo import mlp_model
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.protocol import ExecutionResult
from agent.scheduling.scheduler import ModelScheduler
from agent.tensors.limits import output_row_bytes, rows_within, tensor_bytes
from agent.tensors.signature import ModelSignature, ValidatedRequest

ROW_BYTES = 64 * 4 + 10 * 4  # FP32 [64] in, FP32 [10] out


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> OnnxBackend:
    path: Path = tmp_path_factory.mktemp("mlp") / "model.onnx"
    path.write_bytes(mlp_model().SerializeToString())
    return OnnxBackend(path, mc.ModelConfig(name="mlp"), intra_op_threads=1)


def request(rows: int) -> ValidatedRequest:
    x = np.linspace(-1, 1, rows * 64, dtype=np.float32).reshape(rows, 64)
    return ValidatedRequest({"INPUT0": x}, ("OUTPUT0",), rows)


async def submit_all(
    backend: OnnxBackend, requests: list[ValidatedRequest], max_batch_bytes: int
) -> list[ExecutionResult | BaseException]:
    with ThreadPoolExecutor(1) as executor:
        scheduler = ModelScheduler(
            model="mlp",
            version=1,
            backend=backend,
            # Without the byte cap these would wait the (long) delay and run as one batch.
            policy=BatchingPolicy(max_batch_size=8, max_queue_delay_us=10_000_000),
            instances=1,
            executor=executor,
            max_batch_bytes=max_batch_bytes,
            output_row_bytes=40,
        )
        return await asyncio.gather(
            *(scheduler.submit(r) for r in requests), return_exceptions=True
        )


def test_queued_requests_are_split_into_batches_within_the_byte_cap(backend: OnnxBackend) -> None:
    results = asyncio.run(submit_all(backend, [request(1) for _ in range(6)], 2 * ROW_BYTES + 10))
    assert all(isinstance(r, ExecutionResult) for r in results)
    sizes = [r.batch_size for r in results if isinstance(r, ExecutionResult)]
    assert sizes == [2] * 6  # three executions of two rows each
    alone = backend.run({"INPUT0": request(1).feeds["INPUT0"]}, ["OUTPUT0"])[0]
    first = results[0]
    assert isinstance(first, ExecutionResult)
    np.testing.assert_allclose(first.outputs[0], alone, rtol=1e-5)


def test_a_request_over_the_byte_cap_is_refused_and_the_rest_run(backend: OnnxBackend) -> None:
    requests = [request(3), request(1), request(1)]
    refused, *served = asyncio.run(submit_all(backend, requests, 2 * ROW_BYTES + 10))
    assert isinstance(refused, PayloadTooLargeError)
    assert "memory plan allows one execution" in refused.message
    assert all(isinstance(r, ExecutionResult) and r.batch_size == 2 for r in served)


def test_the_byte_estimates() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=4)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[64])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[10])
    config.output.add(name="VAR", data_type=mc.TYPE_INT64, dims=[-1, 3])
    per_row = output_row_bytes(ModelSignature.from_config(config))
    assert per_row == 10 * 4 + 3 * 8  # variable dims count as 1
    assert tensor_bytes(request(2), per_row) == 2 * 64 * 4 + 2 * per_row
    assert rows_within(1000, 1, 300) == 3
    assert rows_within(1000, 5, 300) == 5  # the first request always runs whole
