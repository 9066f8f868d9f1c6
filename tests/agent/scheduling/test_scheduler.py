"""ModelScheduler on a real ONNX Runtime session: where executions run (executor or inline)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from agent.backends.base import Backend, NamedOutputs, RequestFeeds, RunsRequests, StartsRequests
from agent.backends.cancellation import CancelSignal
from agent.backends.onnx import OnnxBackend
from agent.errors import AgentError, BackendError
from agent.proto import model_config_pb2 as mc
from agent.runtime.demo import mlp_model
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.scheduler import ModelScheduler
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.datatypes import ModelTensor
from agent.tensors.request import RequestContext
from agent.tensors.signature import ValidatedRequest


class RecordingBackend(Backend):
    """The real ONNX backend, noting which thread ran each execution; `burn_ns` adds CPU work."""

    def __init__(self, inner: OnnxBackend) -> None:
        self.inner = inner
        self.threads: list[int] = []
        self.burn_ns = 0
        self.device_wait_s = 0.0  # a wait that uses no CPU, like a GPU model's

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
        self.threads.append(threading.get_ident())
        end = time.thread_time_ns() + self.burn_ns
        while time.thread_time_ns() < end:  # CPU time, not wall time: a model this slow
            pass
        if self.device_wait_s:
            threading.Event().wait(self.device_wait_s)
        return self.inner.run(feeds, output_names, shrink_memory=shrink_memory)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def onnx_backend(tmp_path_factory: pytest.TempPathFactory) -> OnnxBackend:
    path = tmp_path_factory.mktemp("mlp") / "model.onnx"
    path.write_bytes(mlp_model().SerializeToString())
    return OnnxBackend(path, mc.ModelConfig(name="mlp"), intra_op_threads=1)


def request(seed: int, rows: int = 1, width: int = 64) -> ValidatedRequest:
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return ValidatedRequest({"INPUT0": x}, ("OUTPUT0",), rows)


async def submit_each(scheduler: ModelScheduler, seeds: Sequence[int]) -> list[np.ndarray]:
    """One request at a time, so every request is its own execution."""
    return [(await scheduler.submit(request(s))).outputs[0] for s in seeds]


UNBATCHED = BatchingPolicy(max_batch_size=8, dynamic_batching=False)


def mlp_scheduler(
    backend: Backend,
    executor: ThreadPoolExecutor,
    inline_below_ns: int,
    policy: BatchingPolicy = UNBATCHED,
    **options: Any,
) -> ModelScheduler:
    """The MLP on one instance (without dynamic batching unless `policy` says otherwise)."""
    return ModelScheduler(
        model="mlp",
        version=1,
        backend=backend,
        policy=policy,
        instances=1,
        executor=executor,
        inline_below_ns=inline_below_ns,
        **options,
    )


def run_scheduler(
    backend: RecordingBackend, inline_below_ns: int, seeds: Sequence[int]
) -> tuple[list[np.ndarray], int, bool]:
    """Submit the seeds; returns the outputs, the event loop's thread and `inline` at the end."""
    with ThreadPoolExecutor(1) as executor:

        async def main() -> tuple[list[np.ndarray], int, bool]:
            scheduler = mlp_scheduler(backend, executor, inline_below_ns)
            outputs = await submit_each(scheduler, seeds)
            return outputs, threading.get_ident(), scheduler.inline

        return asyncio.run(main())


def test_a_fast_model_runs_inline_after_its_probe_runs(onnx_backend: OnnxBackend) -> None:
    backend = RecordingBackend(onnx_backend)
    outputs, loop_thread, inline = run_scheduler(backend, 10**12, range(8))
    assert inline
    # Measured on the executor first, then on the event loop's own thread.
    assert all(t != loop_thread for t in backend.threads[:4])
    assert backend.threads[4:] == [loop_thread] * 4
    for seed, out in zip(range(8), outputs, strict=True):
        expected = onnx_backend.run(request(seed).feeds, ["OUTPUT0"])[0]
        np.testing.assert_array_equal(out, expected)


def test_a_zero_threshold_keeps_every_execution_on_the_executor(
    onnx_backend: OnnxBackend,
) -> None:
    backend = RecordingBackend(onnx_backend)
    _, loop_thread, inline = run_scheduler(backend, 0, range(10))
    assert not inline
    assert len(backend.threads) == 10
    assert loop_thread not in backend.threads


def test_a_slow_execution_moves_the_model_back_to_the_executor(
    onnx_backend: OnnxBackend,
) -> None:
    backend = RecordingBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            # 5 ms of CPU: the MLP is far below, burning 40 ms not
            scheduler = mlp_scheduler(backend, executor, 5_000_000)
            await submit_each(scheduler, range(4))
            assert scheduler.inline
            backend.burn_ns = 40_000_000
            await submit_each(scheduler, [4])  # ran inline, measured slow
            assert not scheduler.inline
            await submit_each(scheduler, [5])
            loop_thread = threading.get_ident()
            assert backend.threads[4] == loop_thread
            assert backend.threads[5] != loop_thread

        asyncio.run(main())


def test_an_inline_runtime_failure_fails_only_its_request(onnx_backend: OnnxBackend) -> None:
    backend = RecordingBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            scheduler = mlp_scheduler(backend, executor, 10**12)
            await submit_each(scheduler, range(4))
            assert scheduler.inline
            with pytest.raises(BackendError, match="onnxruntime failed"):
                await scheduler.submit(request(0, width=5))  # ONNX Runtime refuses the shape
            after = await scheduler.submit(request(1))
            assert after.outputs[0].shape == (1, 10)
            assert scheduler.pending == 0

        asyncio.run(main())


def test_inline_batches_still_form_from_concurrent_requests(onnx_backend: OnnxBackend) -> None:
    backend = RecordingBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            batching = BatchingPolicy(
                max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=60_000_000
            )
            scheduler = mlp_scheduler(backend, executor, 10**12, batching)
            for _ in range(4):  # probe runs: four batches of four
                await asyncio.gather(*(scheduler.submit(request(s)) for s in range(4)))
            assert scheduler.inline
            results = await asyncio.gather(*(scheduler.submit(request(s)) for s in range(4)))
            assert [r.batch_size for r in results] == [4, 4, 4, 4]
            assert len(backend.threads) == 5

        asyncio.run(main())


def test_executions_count_the_same_inline_and_on_the_executor(onnx_backend: OnnxBackend) -> None:
    stats = ModelStatistics("mlp", "1")
    backend = RecordingBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            scheduler = mlp_scheduler(backend, executor, 10**12, stats=stats)
            results = [await scheduler.submit(request(s, rows=2)) for s in range(8)]
            assert scheduler.inline
            assert [r.batch_size for r in results] == [2] * 8
            assert all(r.outputs[0].shape == (2, 10) for r in results)

        asyncio.run(main())
    snap = stats.snapshot()
    assert (snap.execution_count, snap.inference_count, snap.pending) == (8, 16, 0)
    assert [(b.batch_size, b.compute_infer.count) for b in snap.batch_stats] == [(2, 8)]


def test_a_model_that_waits_without_cpu_stays_on_the_executor(onnx_backend: OnnxBackend) -> None:
    backend = RecordingBackend(onnx_backend)
    backend.device_wait_s = 0.05  # 50 ms of wall time, almost no CPU: limits 1 ms CPU, 10 ms wall
    outputs, loop_thread, inline = run_scheduler(backend, 1_000_000, range(6))
    assert not inline
    assert loop_thread not in backend.threads
    assert len(outputs) == 6


class GatedRequestsBackend(RecordingBackend, RunsRequests):
    """Takes a batch's requests unmerged (as the Python backend), holds each execution until
    `gate` opens, and records each request's cancel signal as it finishes."""

    def __init__(self, inner: OnnxBackend) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.seen: list[list[bool]] = []  # per execution: was each request cancelled

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        self.started.set()
        self.gate.wait(30)
        self.seen.append([signal.cancelled for signal in cancelled])
        return [
            dict(zip(names, self.inner.run(feeds, names), strict=True)) for feeds, names in requests
        ]


def test_cancelled_requests_are_skipped_in_the_queue_and_signalled_while_running(
    onnx_backend: OnnxBackend,
) -> None:
    backend = GatedRequestsBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            scheduler = mlp_scheduler(backend, executor, 0)
            running = asyncio.ensure_future(scheduler.submit(request(1)))
            await asyncio.to_thread(backend.started.wait, 30)
            queued = asyncio.ensure_future(scheduler.submit(request(2)))
            await asyncio.sleep(0)  # let it reach the queue
            queued.cancel()
            running.cancel()  # its client went away while it ran
            await asyncio.gather(running, queued, return_exceptions=True)
            backend.gate.set()
            await scheduler.drain()
            after = await scheduler.submit(request(3))  # the instance is free again
            assert after.outputs[0].shape == (1, 10)

        asyncio.run(main())
    # Three executions would mean the cancelled queued request ran: it must not.
    assert backend.seen == [[True], [False]]


def test_stalls_on_the_loop_move_a_model_back_only_when_they_repeat(
    onnx_backend: OnnxBackend,
) -> None:
    backend = RecordingBackend(onnx_backend)
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            # 1 ms of CPU, 10 ms of wall; leaves at 20 ms twice
            scheduler = mlp_scheduler(backend, executor, 1_000_000)
            loop_thread = threading.get_ident()
            await submit_each(scheduler, range(4))
            assert scheduler.inline
            backend.device_wait_s = 0.05  # stalls on the loop, as a preempted thread would
            await submit_each(scheduler, [4])
            assert scheduler.inline  # one stall
            await submit_each(scheduler, [5])
            assert not scheduler.inline  # two in a row
            backend.device_wait_s = 0.0
            await submit_each(scheduler, [6, 7])  # quick again on the executor: back inline
            assert scheduler.inline
            assert backend.threads[4:6] == [loop_thread] * 2
            assert backend.threads[6] != loop_thread
            assert backend.threads[7] == loop_thread

        asyncio.run(main())


class AnswersByName(Backend, RunsRequests):
    """As a Python model that returns B before A and never C: answers by name, in its order."""

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return ()

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return ()

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        raise AssertionError("a backend that answers by name is always asked by name")

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        x = np.zeros((1, 1), np.float32)
        return [{n: x + ord(n) for n in ("B", "A") if n in names} for _, names in requests]

    def close(self) -> None:
        pass


def test_a_backend_answering_by_name_gives_its_order_and_leaves_out_what_it_did_not_return() -> (
    None
):
    backend = AnswersByName()
    with ThreadPoolExecutor(1) as executor:

        async def main() -> tuple[list[list[str]], bool]:
            scheduler = mlp_scheduler(backend, executor, 10**12)  # inline once measured
            asked = ValidatedRequest({"X": np.zeros((1, 1), np.float32)}, ("A", "C", "B"), 1)
            results = [await scheduler.submit(asked) for _ in range(6)]
            named = [list(r.named(asked.output_names)) for r in results]
            for pairs in named:
                assert [float(a[0, 0]) for _, a in pairs] == [ord("B"), ord("A")]
            return [[n for n, _ in pairs] for pairs in named], scheduler.inline

        names, inline = asyncio.run(main())
    assert inline  # the executor's answers and the inline ones alike
    assert names == [["B", "A"]] * 6


class LoopStartingBackend(RecordingBackend, RunsRequests, StartsRequests):
    """Starts every other batch from the event loop (as the Python backend does when a worker
    is idle) and declines the others, which then run on the executor; `fail` fails the next
    started batch."""

    def __init__(self, inner: OnnxBackend) -> None:
        super().__init__(inner)
        self.started_on_loop = 0
        self.declined = 0
        self.fail: AgentError | None = None
        self.broken = False  # start_requests raises: nothing started

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        self.threads.append(threading.get_ident())
        return [
            dict(zip(names, self.inner.run(feeds, names), strict=True)) for feeds, names in requests
        ]

    def start_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
        executor: Executor,
    ) -> asyncio.Future[list[NamedOutputs | AgentError]] | None:
        if self.broken:
            raise ValueError("cannot encode")
        if (self.started_on_loop + self.declined) % 2:
            self.declined += 1
            return None
        self.started_on_loop += 1
        future: asyncio.Future[list[NamedOutputs | AgentError]]
        future = asyncio.get_running_loop().create_future()
        if self.fail is not None:
            future.set_exception(self.fail)
            self.fail = None
        else:
            future.set_result(
                [
                    dict(zip(names, self.inner.run(feeds, names), strict=True))
                    for feeds, names in requests
                ]
            )
        return future


def test_a_backend_that_starts_batches_on_the_loop_skips_the_executor_when_it_can(
    onnx_backend: OnnxBackend,
) -> None:
    backend = LoopStartingBackend(onnx_backend)
    stats = ModelStatistics("mlp", "1")
    expected = [onnx_backend.run(request(s).feeds, ["OUTPUT0"])[0] for s in range(6)]
    with ThreadPoolExecutor(1) as executor:

        async def main() -> tuple[list[np.ndarray], int]:
            scheduler = mlp_scheduler(backend, executor, 0, stats=stats)
            outputs = await submit_each(scheduler, range(6))
            backend.fail = BackendError("the worker said no")
            with pytest.raises(BackendError, match="the worker said no"):
                await scheduler.submit(request(7))
            after = await scheduler.submit(request(8))  # the instance is free again
            assert after.outputs[0].shape == (1, 10)
            return outputs, threading.get_ident()

        outputs, loop_thread = asyncio.run(main())
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert backend.started_on_loop == 4  # 3 of the 6, and the failed one
    assert backend.declined == 4
    assert len(backend.threads) == 4
    assert loop_thread not in backend.threads
    snapshot = stats.snapshot()
    assert snapshot.execution_count == 8  # both ways count, the raised one too (as in Triton)
    assert snapshot.inference_count == 7  # the raised one's rows are no inferences


def test_a_batch_the_backend_fails_to_start_on_the_loop_runs_on_the_executor(
    onnx_backend: OnnxBackend,
) -> None:
    backend = LoopStartingBackend(onnx_backend)
    backend.broken = True
    with ThreadPoolExecutor(1) as executor:

        async def main() -> None:
            scheduler = mlp_scheduler(backend, executor, 0)
            answer = await scheduler.submit(request(1))
            assert answer.outputs[0].shape == (1, 10)

        asyncio.run(main())
    assert len(backend.threads) == 1
