"""Asyncio driver for one model version: queue requests, form batches, run them off the loop.

The batch-forming policy lives in `agent.scheduling.batching` (pure, fed timestamps). This module
only
drives it: it calls `expire`/`take` when a request arrives, when an execution finishes and when
the policy's deadline comes (a loop timer), runs each batch on the model's executor (one worker
per instance), splits the outputs back per request and records statistics.

Tiny models run inline: handing a batch to an executor thread and its result back costs the event
loop about 300 µs of CPU per execution (thread wake-ups and GIL ping-pong, measured with
`bench.cpu_per_request`), more than the demo MLP takes to compute. Once a version's measured
execution CPU time is below `inline_below_ns`, and its wall time below ten times that (a GPU
model can wait for its device without using CPU), its batches run on the event loop thread
instead; executions well over either bar move it back to the executor
(`agent.scheduling.inline_gauge` has the rules: wall times measured on the executor hold the
wait for the GIL, so only the quickest of them counts).

A backend that waits for another process (the Python backend's workers) may start a batch from
the loop itself (`StartsRequests`): it sends the batch and is woken by the loop when the answer
comes, so neither the hand-off nor the loop is spent on waiting. When it declines (no idle
worker, large inputs), the batch goes to the executor as any other.

Memory: with `max_batch_bytes` (from the model's memory plan), a request whose tensors alone
(inputs, plus a lower bound on its outputs) need more is refused with `PayloadTooLargeError`,
and batches are split so that their rows, at the largest per-row size queued, stay within it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from agent.backends.base import (
    Backend,
    DecoupledRequest,
    NamedOutputs,
    ReleasesMemory,
    ResponseSink,
    RunsDecoupled,
    RunsRequests,
    StartsRequests,
    response_parameters,
)
from agent.backends.cancellation import CancelSignal
from agent.errors import (
    AgentError,
    BackendError,
    ModelInstanceFailedError,
    ModelNotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from agent.scheduling.batching import BatchFormer, BatchingPolicy
from agent.scheduling.deadline_timer import DeadlineTimer
from agent.scheduling.inline_gauge import InlineGauge
from agent.scheduling.memory_release import RELEASE_AFTER_S, MemoryReleaser
from agent.scheduling.protocol import ExecutionResult, KeepsSequences
from agent.scheduling.rate_limiter import RateLimiter, ResourceNeed
from agent.scheduling.sequence_policy import SequenceRequest
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.limits import rows_within, tensor_bytes
from agent.tensors.signature import ValidatedRequest

# Executions that may block the event loop: the hand-off they skip costs more than this.
# (At 200 µs the benchmark MLP's dynamically batched executions moved inline too, and cost
# more CPU per request there than on the executor: fewer requests join each batch.)
INLINE_BELOW_NS = 100_000


@dataclass(slots=True)
class _Job:
    request: ValidatedRequest
    future: asyncio.Future[ExecutionResult]
    enqueued_ns: int
    seq: int
    row_bytes: int = 0  # its tensor bytes per row (with max_batch_bytes)
    # Set when the caller stops waiting (client gone, parent BLS call cancelled): a queued job
    # is then skipped, a running one told to its backend (`run_requests`).
    cancel: CancelSignal = field(default_factory=CancelSignal)
    sink: ResponseSink | None = None  # decoupled: where the responses go


class LimiterGate:
    """Shares one RateLimiter between schedulers and wakes the one whose waiter was granted."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter
        self._callbacks: dict[str, Callable[[], None]] = {}

    def acquire(self, key: str, need: ResourceNeed, on_grant: Callable[[], None]) -> bool:
        if self.limiter.try_acquire(key, need):
            return True
        self._callbacks[key] = on_grant
        return False

    def release(self, need: ResourceNeed) -> None:
        for key in self.limiter.release(need):
            callback = self._callbacks.pop(key, None)
            if callback is not None:
                callback()


class ModelScheduler:
    """Queues and executes the requests of one loaded model version (a `Scheduler`)."""

    sequences: KeepsSequences | None = None  # a stateless model keeps no sequences

    def __init__(
        self,
        *,
        model: str,
        version: int,
        backend: Backend,
        policy: BatchingPolicy,
        instances: int,
        executor: Executor,
        stats: ModelStatistics | None = None,
        gate: LimiterGate | None = None,
        need: ResourceNeed | None = None,
        max_pending: int = 1024,
        inline_below_ns: int = INLINE_BELOW_NS,
        max_batch_bytes: int | None = None,
        output_row_bytes: int = 0,
        release_after_s: float = RELEASE_AFTER_S,
    ) -> None:
        self.model = model
        self.version = version
        self.policy = policy
        self._backend = backend
        # What the backend declared it can do besides `run`, resolved once (never per request).
        # A backend that takes a batch's requests one by one (Python models, as Triton's Python
        # backend) gets them unmerged, and answers each with its outputs or its error; with
        # their traces, the parents of the BLS requests they make; it is told which requests
        # are cancelled while they run.
        self._run_requests = backend.run_requests if isinstance(backend, RunsRequests) else None
        self._run_decoupled = backend.run_decoupled if isinstance(backend, RunsDecoupled) else None
        # ... and may start them from the loop itself, without an executor hand-off.
        self._start_requests = (
            backend.start_requests if isinstance(backend, StartsRequests) else None
        )
        self._former: BatchFormer[_Job] = BatchFormer(policy)
        self._free = max(1, instances)
        self._instances = max(1, instances)
        self._executor = executor
        self._stats = stats
        self._gate = gate
        self._need = need or ResourceNeed()
        self._max_pending = max_pending
        self._seq = itertools.count()
        self._timer: DeadlineTimer | None = None  # made on the loop, at the first deadline
        self._timer_at: float | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._holding = 0  # batches taken but waiting for rate-limiter resources
        # preserve_ordering: results released strictly in arrival order.
        self._next_release = 0
        self._done: dict[int, tuple[_Job, ExecutionResult | BaseException]] = {}
        self._max_batch_bytes = max_batch_bytes
        self._output_row_bytes = output_row_bytes
        self._gauge = InlineGauge(inline_below_ns)
        self.releaser = MemoryReleaser(
            backend.release_memory if isinstance(backend, ReleasesMemory) else None,
            executor,
            lambda: not self.pending,
            release_after_s,
        )

    @property
    def pending(self) -> int:
        """Requests queued or executing."""
        return len(self._former) + (self._instances - self._free) + self._holding

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Change batching parameters live; queued requests move to the new former in order."""
        old = self._former
        self.policy = policy
        self._former = BatchFormer(policy)
        now = time.monotonic()
        for job in old.drain():
            try:
                self._former.add(job, job.request.batch_size, now)
            except AgentError as exc:  # e.g. the new cap is below this request's rows
                self._finish(job, exc)
        self._dispatch()

    async def submit(
        self,
        request: ValidatedRequest,
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        sequence: SequenceRequest | None = None,
        responses: ResponseSink | None = None,
    ) -> ExecutionResult:
        """Queue a validated request and wait for its outputs.

        `sequence` is ignored: a model without a sequence batcher keeps no state between
        requests (Triton ignores the flags too).
        `responses` (decoupled models): the request's responses go there as the model sends
        them; this returns (with no outputs) once the `execute` call that took it returned.

        Raises:
            OverloadedError: the queue is full (503).
            InvalidInputError: bad priority or a batch over the cap.
            RequestTimeoutError: its queue timeout expired with action REJECT.
            ModelNotReadyError: the version was unloaded before it ran.
            BackendError: the runtime failed.
        """
        if self._closed:
            raise ModelNotReadyError(f"model '{self.model}' version {self.version} is unloading")
        queued = len(self._former)  # a sum over the priority levels: read once
        if queued >= self._max_pending:
            raise OverloadedError(
                f"Exceeds maximum queue size: model '{self.model}' has {self._max_pending} "
                "requests queued; retry later"
            )
        need = 0
        if self._max_batch_bytes is not None:
            need = tensor_bytes(request, self._output_row_bytes)
            if need > self._max_batch_bytes:
                raise PayloadTooLargeError(
                    f"model '{self.model}': the request's tensors need {need} bytes, over the "
                    f"{self._max_batch_bytes} bytes its memory plan allows one execution"
                )
        if (
            responses is None
            and priority is None
            and timeout_us is None
            and self._free == self._instances
            and self._holding == 0
            and not queued
            and self._gauge.inline
            and self._alone_now(request)
        ):
            return self._run_now(request)
        loop = asyncio.get_running_loop()
        job = _Job(
            request,
            loop.create_future(),
            time.perf_counter_ns(),
            -1,
            -(-need // max(1, request.batch_size)),
            sink=responses,
        )
        self._former.add(
            job, request.batch_size, time.monotonic(), priority=priority, timeout_us=timeout_us
        )
        job.seq = next(self._seq)  # only accepted requests take a place in the release order
        self._idle.clear()
        if self._stats is not None:
            self._stats.pending_inc()
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancel.cancel()
            raise
        finally:
            if self._stats is not None:
                self._stats.pending_dec()

    def _alone_now(self, request: ValidatedRequest) -> bool:
        """Whether the policy would run this request, alone in an empty queue, at once."""
        policy = self.policy
        return (
            not (self._gate is not None and self._need.resources)
            and 1 <= request.batch_size <= policy.max_batch_size
            and (not policy.dynamic_batching or policy.max_queue_delay_us == 0)
        )

    def _run_now(self, request: ValidatedRequest) -> ExecutionResult:
        """Run one request inline, bypassing queue, future and batch forming.

        Only when nothing is queued or executing, so the order of results cannot change; the
        statistics and errors are those of a one-request batch on the normal path.
        """
        cpu_start = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        parameters = None
        try:
            # A Python model answers by name (the outputs it returned, in its order), sees the
            # request's id and parameters; a traced request's BLS requests are children of its
            # trace.
            names = None
            if (run_requests := self._run_requests) is not None:
                try:
                    (answer,) = run_requests(
                        [(request.feeds, request.output_names)],
                        traces=[request.trace],
                        contexts=[request.context],
                    )
                except BackendError as exc:
                    self._count_raised(exc, request.batch_size, time.perf_counter_ns() - t0)
                    raise
                if isinstance(answer, BaseException):
                    ns = time.perf_counter_ns() - t0
                    if self._stats is not None:
                        self._stats.record_execution(
                            batch_size=request.batch_size,
                            compute_input_ns=0,
                            compute_infer_ns=ns,
                            compute_output_ns=0,
                        )
                    raise _answered(answer, 0, ns)
                outputs, names = list(answer.values()), tuple(answer)
                parameters = response_parameters(answer)
            else:
                outputs = self._backend.run(request.feeds, request.output_names)
        except AgentError:
            raise
        except Exception as exc:  # noqa: BLE001 - as _complete: the runtime failed
            raise BackendError(f"execution failed: {exc}") from None
        t1 = time.perf_counter_ns()
        if self._stats is not None:
            self._stats.record_execution(
                batch_size=request.batch_size,
                compute_input_ns=0,
                compute_infer_ns=t1 - t0,
                compute_output_ns=0,
            )
        self._gauge.measured(time.thread_time_ns() - cpu_start, t1 - t0, on_loop=True)
        return ExecutionResult(outputs, 0, 0, t1 - t0, 0, request.batch_size, names, parameters)

    async def drain(self) -> None:
        """Wait until nothing is queued or executing."""
        while self.pending:
            self._idle.clear()
            await self._idle.wait()

    def close(self, reason: str = "was unloaded") -> None:
        """Refuse new work and fail whatever is still queued, saying why (`reason`)."""
        self._closed = True
        self.releaser.cancel()
        if self._timer is not None:
            self._timer.close()
        for job in self._former.drain():
            self._finish(job, ModelNotReadyError(f"model '{self.model}' {reason}"))
        self._check_idle()

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for job in self._former.expire(now):
            self._finish(job, RequestTimeoutError("Request timeout expired"))
        while self._free > 0 and self._holding == 0:
            cap = self._rows_in_budget()
            batch = self._former.take(now, cap)
            if batch is None and cap is not None and self._former:
                # take() swept expired requests first: the head the cap was made for is gone.
                batch = self._former.take(now, self._rows_in_budget())
            if batch is None:
                break
            jobs = [job for job in batch.items if not job.cancel.cancelled]
            if not jobs:  # every caller went away while it waited: no work to run
                continue
            self._free -= 1
            if self._gate is not None and self._need.resources:
                key = f"{self.model}:{self.version}#{jobs[0].seq}"
                if not self._gate.acquire(key, self._need, functools.partial(self._granted, jobs)):
                    self._holding += 1
                    break
            self._launch(jobs)
            now = time.monotonic()  # an inline execution moved the clock on
        self._arm_timer(loop)
        self._check_idle()

    def _rows_in_budget(self) -> int | None:
        """The row cap that keeps the next batch within max_batch_bytes (None: no cap)."""
        if self._max_batch_bytes is None or len(self._former) < 2:
            return None
        queued = list(self._former.queued())
        widest = max(job.row_bytes for job, _ in queued)
        return rows_within(self._max_batch_bytes, queued[0][1], widest)

    def _granted(self, jobs: list[_Job]) -> None:
        self._holding -= 1
        self._launch(jobs)
        self._dispatch()

    @property
    def inline(self) -> bool:
        """Whether batches now run on the event loop (measured fast enough), not the executor."""
        return self._gauge.inline

    def _launch(self, jobs: list[_Job]) -> None:
        started = time.perf_counter_ns()
        if self.inline:
            # Completes here; the caller's dispatch loop takes the next batch (no recursion).
            try:
                outcome: list[ExecutionResult | BaseException] | BaseException = self._execute(
                    jobs, started, True
                )
            except Exception as exc:  # noqa: BLE001 - reported to the requests as BackendError
                outcome = exc
            self._complete(jobs, outcome)
            return
        if self._start_on_loop(jobs, started):
            return
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._execute, jobs, started, False)
        future.add_done_callback(lambda f: self._on_done(jobs, f))

    def _start_on_loop(self, jobs: list[_Job], started_ns: int) -> bool:
        """Start the batch from the loop when the backend can (`StartsRequests`): no executor
        hand-off; False when it cannot now."""
        start = self._start_requests
        if start is None or jobs[0].sink is not None:
            return False
        if len(jobs) > 1 and len(_group_by_shape(jobs)) > 1:
            return False  # `_execute` runs each group in turn
        t0 = time.perf_counter_ns()
        try:
            answered = start(
                [(job.request.feeds, job.request.output_names) for job in jobs],
                cancelled=[job.cancel for job in jobs],
                traces=[job.request.trace for job in jobs],
                contexts=[job.request.context for job in jobs],
                executor=self._executor,
            )
        except Exception:  # noqa: BLE001 - nothing started: the executor runs it (and fails it)
            return False
        if answered is None:
            return False

        def done(future: asyncio.Future[list[NamedOutputs | AgentError]]) -> None:
            outcome: list[ExecutionResult | BaseException] | BaseException
            error = future.exception()
            if error is not None:
                if isinstance(error, BackendError):
                    rows = sum(job.request.batch_size for job in jobs)
                    self._count_raised(error, rows, time.perf_counter_ns() - t0)
                outcome = error
            else:
                group = list(range(len(jobs)))
                outcome = self._results_of(jobs, group, future.result(), started_ns, t0)
            self._complete(jobs, outcome)
            self._after_execution()

        answered.add_done_callback(done)
        return True

    def _results_of(
        self,
        jobs: Sequence[_Job],
        group: list[int],
        answers: Sequence[NamedOutputs | AgentError],
        started_ns: int,
        t0: int,
    ) -> list[ExecutionResult | BaseException]:
        """The results of one group's `run_requests` answers (recorded in the statistics): each
        request's outputs by name, in the model's order, or the error it was answered with."""
        t2 = time.perf_counter_ns()
        rows = sum(jobs[i].request.batch_size for i in group)
        results: list[ExecutionResult | BaseException] = []
        for i, answer in zip(group, answers, strict=True):
            queue_ns = max(0, started_ns - jobs[i].enqueued_ns)
            results.append(
                _answered(answer, queue_ns, t2 - t0)
                if isinstance(answer, BaseException)
                else ExecutionResult(
                    outputs=list(answer.values()),
                    queue_ns=queue_ns,
                    compute_input_ns=0,
                    compute_infer_ns=t2 - t0,
                    compute_output_ns=0,
                    batch_size=rows,
                    names=tuple(answer),
                    parameters=response_parameters(answer),
                )
            )
        if self._stats is not None:
            self._stats.record_execution(
                batch_size=rows,
                compute_input_ns=0,
                compute_infer_ns=t2 - t0,
                compute_output_ns=0,
            )
        return results

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        # With every instance busy, the next dispatch comes from a finishing execution; a timer
        # for a batch that is already due would only spin. Queue timeouts are still checked then.
        idle = self._free > 0 and self._holding == 0
        deadline = self._former.deadline() if idle else self._former.expiry_deadline()
        if deadline == self._timer_at or self._closed:
            return
        self._timer_at = deadline
        if self._timer is None:
            if deadline is None:
                return
            self._timer = DeadlineTimer(loop, self._on_timer)
        self._timer.arm(deadline)

    def _on_timer(self) -> None:
        self._timer_at = None
        self._dispatch()

    def _execute(
        self, jobs: Sequence[_Job], started_ns: int, on_loop: bool
    ) -> list[ExecutionResult | BaseException]:
        """Run in an executor thread (or inline, `on_loop`): concatenate, run, split."""
        if jobs[0].sink is not None:
            return self._execute_decoupled(jobs, started_ns)
        cpu_start = time.thread_time_ns()
        run_ns = 0  # wall time inside the backend (where a device wait shows)
        results: list[ExecutionResult | BaseException | None] = [None] * len(jobs)
        groups = [[0]] if len(jobs) == 1 else _group_by_shape(jobs)
        run_requests = self._run_requests  # None: the batch is merged for `run`
        for group in groups:
            t0 = time.perf_counter_ns()
            if run_requests is not None:
                rows = sum(jobs[i].request.batch_size for i in group)
                try:
                    answers = run_requests(
                        [(jobs[i].request.feeds, jobs[i].request.output_names) for i in group],
                        cancelled=[jobs[i].cancel for i in group],
                        traces=[jobs[i].request.trace for i in group],
                        contexts=[jobs[i].request.context for i in group],
                    )
                except BackendError as exc:
                    self._count_raised(exc, rows, time.perf_counter_ns() - t0)
                    raise
                run_ns += time.perf_counter_ns() - t0
                for i, result in zip(
                    group, self._results_of(jobs, group, answers, started_ns, t0), strict=True
                ):
                    results[i] = result
                continue
            names = (
                list(jobs[group[0]].request.output_names)
                if len(group) == 1
                else _union_outputs(jobs[i].request.output_names for i in group)
            )
            if len(group) == 1:
                feeds = jobs[group[0]].request.feeds
            else:
                feeds = {
                    n: np.concatenate([jobs[i].request.feeds[n] for i in group])
                    for n in jobs[group[0]].request.feeds
                }
            t1 = time.perf_counter_ns()
            outputs = self._backend.run(feeds, names)
            t2 = time.perf_counter_ns()
            run_ns += t2 - t1
            by_name = dict(zip(names, outputs, strict=True))
            rows = sum(jobs[i].request.batch_size for i in group)
            offset = 0
            split: dict[int, list[np.ndarray]] = {}
            for i in group:
                n = jobs[i].request.batch_size
                if len(group) == 1:
                    split[i] = [by_name[o] for o in jobs[i].request.output_names]
                else:
                    split[i] = [
                        by_name[o][offset : offset + n] for o in jobs[i].request.output_names
                    ]
                offset += n
            t3 = time.perf_counter_ns()
            for i in group:
                results[i] = ExecutionResult(
                    outputs=split[i],
                    queue_ns=max(0, started_ns - jobs[i].enqueued_ns),
                    compute_input_ns=t1 - t0,
                    compute_infer_ns=t2 - t1,
                    compute_output_ns=t3 - t2,
                    batch_size=rows,
                )
            if self._stats is not None:
                self._stats.record_execution(
                    batch_size=rows,
                    compute_input_ns=t1 - t0,
                    compute_infer_ns=t2 - t1,
                    compute_output_ns=t3 - t2,
                )
        self._gauge.measured(time.thread_time_ns() - cpu_start, run_ns, on_loop=on_loop)
        return [r for r in results if r is not None]

    def _execute_decoupled(
        self, jobs: Sequence[_Job], started_ns: int
    ) -> list[ExecutionResult | BaseException]:
        """A decoupled model's batch: one `execute` call; the responses go to the sinks."""
        run = self._run_decoupled
        if run is None:
            raise BackendError(f"model '{self.model}' cannot run decoupled requests")
        t0 = time.perf_counter_ns()
        requests: list[DecoupledRequest] = []
        for job in jobs:
            assert job.sink is not None  # a decoupled model is reached through streams only
            requests.append((job.request.feeds, job.request.output_names, job.sink))
        run(requests, contexts=[job.request.context for job in jobs])
        t1 = time.perf_counter_ns()
        rows = sum(j.request.batch_size for j in jobs)
        if self._stats is not None:
            self._stats.record_execution(
                batch_size=rows, compute_input_ns=0, compute_infer_ns=t1 - t0, compute_output_ns=0
            )
        return [
            ExecutionResult([], max(0, started_ns - j.enqueued_ns), 0, t1 - t0, 0, rows)
            for j in jobs
        ]

    def _on_done(
        self, jobs: list[_Job], future: asyncio.Future[list[ExecutionResult | BaseException]]
    ) -> None:
        error = future.exception()
        self._complete(jobs, future.result() if error is None else error)
        self._after_execution()

    def _after_execution(self) -> None:
        self.releaser.ran()
        if not self._closed:
            self._dispatch()
        self._check_idle()
        if not self.pending and not self._closed:
            self.releaser.idle()

    def _count_raised(self, error: BackendError, rows: int, ns: int) -> None:
        """An execution the model raised in (not an instance that died or never ran): counted
        as Triton counts it, an execution whose rows are no inferences."""
        if self._stats is not None and not isinstance(error, ModelInstanceFailedError):
            self._stats.record_execution(
                batch_size=rows,
                compute_input_ns=0,
                compute_infer_ns=ns,
                compute_output_ns=0,
                failed=True,
            )

    def _complete(
        self, jobs: list[_Job], outcome: list[ExecutionResult | BaseException] | BaseException
    ) -> None:
        self._free += 1
        if self._gate is not None and self._need.resources:
            self._gate.release(self._need)
        if isinstance(outcome, BaseException):
            error = outcome
            if not isinstance(error, AgentError):
                error = BackendError(f"execution failed: {error}")
            for job in jobs:
                self._finish(job, error)
        else:
            for job, result in zip(jobs, outcome, strict=True):
                self._finish(job, result)

    def _finish(self, job: _Job, outcome: ExecutionResult | BaseException) -> None:
        if not self.policy.preserve_ordering:
            settle(job.future, outcome)
            return
        self._done[job.seq] = (job, outcome)
        while self._next_release in self._done:
            ready, result = self._done.pop(self._next_release)
            settle(ready.future, result)
            self._next_release += 1

    def _check_idle(self) -> None:
        if not self.pending:
            self._idle.set()


def _answered(error: BaseException, queue_ns: int, compute_infer_ns: int) -> BaseException:
    """A request's error the model answered with (its execution completed): marked with the
    execution's durations, which the data plane counts as Triton does (a success)."""
    if isinstance(error, AgentError):
        error.answered = (queue_ns, 0, compute_infer_ns, 0)
    return error


def settle(
    future: asyncio.Future[ExecutionResult], outcome: ExecutionResult | BaseException
) -> None:
    """Give a waiting request its result or error (nothing when the client went away)."""
    if future.done():  # the client went away
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _group_by_shape(jobs: Sequence[_Job]) -> list[list[int]]:
    """Requests can share a batch only when every input has the same non-batch shape."""
    groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = {}
    for i, job in enumerate(jobs):
        key = tuple((n, a.shape[1:]) for n, a in job.request.feeds.items())
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _union_outputs(lists: Iterable[Sequence[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for names in lists:
        for n in names:
            seen[n] = None
    return list(seen)
