"""Memory handed back after a burst: the scheduler calls the backend's `release_memory` on its
executor once the model is idle after executor runs (a real ONNX Runtime session shrinks its arena
and still answers afterwards)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from agent.backends.base import Backend, ReleasesMemory
from agent.backends.onnx import OnnxBackend
from agent.proto import model_config_pb2 as mc
from agent.runtime.demo import mlp_model
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.scheduler import ModelScheduler
from agent.tensors.datatypes import ModelTensor
from agent.tensors.signature import ValidatedRequest
from tests.support import wait_until_async


class ReleaseRecordingBackend(Backend, ReleasesMemory):
    """The real ONNX backend, noting the thread of each `release_memory` call."""

    def __init__(self, inner: OnnxBackend) -> None:
        self.inner = inner
        self.release_threads: list[int] = []

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return self.inner.inputs

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return self.inner.outputs

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        return self.inner.run(feeds, output_names, shrink_memory=shrink_memory)

    def release_memory(self) -> None:
        self.release_threads.append(threading.get_ident())
        self.inner.release_memory()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def onnx_backend(tmp_path_factory: pytest.TempPathFactory) -> OnnxBackend:
    path = tmp_path_factory.mktemp("mlp") / "model.onnx"
    path.write_bytes(mlp_model().SerializeToString())
    return OnnxBackend(path, mc.ModelConfig(name="mlp"), intra_op_threads=1)


def request(seed: int, rows: int = 1) -> ValidatedRequest:
    x = np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)
    return ValidatedRequest({"INPUT0": x}, ("OUTPUT0",), rows)


def test_an_idle_model_releases_its_memory_once_after_a_burst(onnx_backend: OnnxBackend) -> None:
    backend = ReleaseRecordingBackend(onnx_backend)
    with ThreadPoolExecutor(2) as executor:

        async def main() -> tuple[int, list[np.ndarray]]:
            scheduler = ModelScheduler(
                model="mlp",
                version=1,
                backend=backend,
                policy=BatchingPolicy(max_batch_size=8, dynamic_batching=False),
                instances=2,
                executor=executor,
                inline_below_ns=0,  # every execution on the executor, as a large model's
                release_after_s=0.01,
            )
            burst = await asyncio.gather(*(scheduler.submit(request(s, 3)) for s in range(6)))
            assert not backend.release_threads  # nothing released while it was busy
            await wait_until_async(lambda: scheduler.releaser.releases == 1, "the release")
            after = await scheduler.submit(request(0, 3))  # still answers after shrinking
            return threading.get_ident(), [burst[0].outputs[0], after.outputs[0]]

        loop_thread, (first, again) = asyncio.run(main())
    assert len(backend.release_threads) == 1
    assert backend.release_threads[0] != loop_thread  # on the executor, not the event loop
    np.testing.assert_array_equal(first, again)


def test_release_memory_runs_a_model_with_a_dynamic_batch_dimension(
    onnx_backend: OnnxBackend,
) -> None:
    onnx_backend.release_memory()  # batch-1 zeros with arena shrinkage, then the heap trimmed
    out = onnx_backend.run(request(1, 2).feeds, ["OUTPUT0"])[0]
    assert out.shape == (2, 10)
