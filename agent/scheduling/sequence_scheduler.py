"""Asyncio driver of the sequence batcher for one model version.

The policy lives in `agent.scheduling.sequence_policy` (pure, fed timestamps). This module drives
it: `expire`/`take` on each arrival, each finished execution and at the policy's deadline (a loop
timer); each batch runs on the model's executor with the control tensors and the sequences' state
added to its inputs; the state outputs are kept per sequence for its next request and dropped
when the sequence ends or idles out. Tiny models run inline on the event loop once measured
cheaper than the hand-off to a thread, by the dynamic scheduler's rule
(`agent.scheduling.scheduler`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.backends.base import (
    Backend,
    DecoupledRequest,
    ResponseSink,
    RunsDecoupled,
    RunsRequests,
    response_parameters,
)
from agent.errors import (
    AgentError,
    BackendError,
    InvalidInputError,
    ModelNotReadyError,
    OverloadedError,
    UnsupportedError,
)
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.deadline_timer import DeadlineTimer
from agent.scheduling.inline_gauge import InlineGauge
from agent.scheduling.protocol import ExecutionResult, KeepsSequences
from agent.scheduling.scheduler import INLINE_BELOW_NS, settle
from agent.scheduling.sequence_policy import (
    CorrelationId,
    SequenceBatcher,
    SequencePolicy,
    SequenceRequest,
    Step,
)
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.signature import ValidatedRequest

logger = logging.getLogger(__name__)

# A batch's outputs per request, and the state each of its sequences returned.
_Outcome = tuple[list[ExecutionResult | BaseException], list[dict[str, np.ndarray]]]


@dataclass(slots=True)
class _Job:
    request: ValidatedRequest
    future: asyncio.Future[ExecutionResult]
    enqueued_ns: int
    sink: ResponseSink | None = None  # decoupled: where the responses go


class SequenceScheduler(KeepsSequences):
    """Queues and executes the requests of one version of a stateful model (a `Scheduler`
    that keeps its sequences: `sequences` is itself)."""

    def __init__(
        self,
        *,
        model: str,
        version: int,
        backend: Backend,
        policy: SequencePolicy,
        tensors: SequenceTensors,
        instances: int,
        executor: Executor,
        stats: ModelStatistics | None = None,
        inline_below_ns: int = INLINE_BELOW_NS,
    ) -> None:
        self.model = model
        self.version = version
        self.sequence_policy = policy
        self.tensors = tensors
        self._backend = backend
        # What the backend declared besides `run`, resolved once (`agent.scheduling.scheduler`).
        self._run_requests = backend.run_requests if isinstance(backend, RunsRequests) else None
        self._run_decoupled = backend.run_decoupled if isinstance(backend, RunsDecoupled) else None
        self._batcher: SequenceBatcher[_Job] = SequenceBatcher(policy, model)
        self._free = max(1, instances)
        self._instances = max(1, instances)
        self._executor = executor
        self._stats = stats
        self._states: dict[CorrelationId, dict[str, np.ndarray]] = {}
        self._timer: DeadlineTimer | None = None
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._gauge = InlineGauge(inline_below_ns)

    @property
    def policy(self) -> BatchingPolicy:
        """The request-size limits, as the dynamic scheduler reports them."""
        return BatchingPolicy.unbatched(self.sequence_policy.max_batch_size)

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Dynamic-batching settings do not apply to a sequence batcher (kept for the reload)."""
        logger.info("model %s: sequence batcher keeps its settings", self.model)

    @property
    def pending(self) -> int:
        """Requests queued or executing, plus live sequences (a drain waits for them to end)."""
        return len(self._batcher) + (self._instances - self._free) + self._batcher.live

    @property
    def live_sequences(self) -> int:
        """Sequences holding a slot."""
        return self._batcher.live

    @property
    def waiting_sequences(self) -> int:
        """New sequences waiting for a slot."""
        return self._batcher.waiting

    @property
    def state_bytes(self) -> int:
        """Bytes of sequence state held now."""
        return sum(a.nbytes for s in self._states.values() for a in s.values())

    @property
    def sequences(self) -> KeepsSequences:
        """The sequences it keeps: its own (`owns`)."""
        return self

    def owns(self, corrid: CorrelationId) -> bool:
        """Whether a sequence with this id is live or waiting for a slot on this version."""
        return not self._closed and self._batcher.owns(corrid)

    async def submit(
        self,
        request: ValidatedRequest,
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        sequence: SequenceRequest | None = None,
        responses: ResponseSink | None = None,
    ) -> ExecutionResult:
        """Queue a request of a sequence and wait for its outputs.

        `priority` is ignored: the sequence batcher has no priority levels (as Triton's).
        `responses` (decoupled models): the request's responses go there as the model sends
        them; the result, once its `execute` returned, holds no outputs.

        Raises:
            InvalidInputError: no correlation id, missing START, wrong id type, batch size > 1.
            OverloadedError: no sequence slot freed within the request's timeout (503).
            ModelNotReadyError: the version is unloading.
            BackendError: the runtime failed.
        """
        if self._closed:
            raise ModelNotReadyError(f"model '{self.model}' version {self.version} is unloading")
        if request.batch_size > 1:
            raise InvalidInputError(
                f"inference request to model '{self.model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        seq = sequence or SequenceRequest(0)
        self.tensors.check_corrid(seq.correlation_id)
        job = _Job(
            request, asyncio.get_running_loop().create_future(), time.perf_counter_ns(), responses
        )
        self._batcher.add(
            seq.correlation_id,
            job,
            start=seq.start,
            end=seq.end,
            now=time.monotonic(),
            timeout_us=timeout_us,
        )
        self._idle.clear()
        if self._stats is not None:
            self._stats.pending_inc()
        self._dispatch()
        try:
            return await job.future
        finally:
            if self._stats is not None:
                self._stats.pending_dec()

    async def drain(self) -> None:
        """Wait until every sequence has ended or idled out and nothing runs."""
        while self.pending:
            self._idle.clear()
            await self._idle.wait()

    def close(self, reason: str = "was unloaded") -> None:
        """Refuse new work and fail whatever is still queued, saying why (`reason`)."""
        self._closed = True
        if self._timer is not None:
            self._timer.close()
        for job in self._batcher.drain():
            settle(job.future, ModelNotReadyError(f"model '{self.model}' {reason}"))
        self._states.clear()
        self._check_idle()

    def _dispatch(self) -> None:
        now = time.monotonic()
        expired = self._batcher.expire(now)
        for job in expired.refused:
            settle(
                job.future,
                OverloadedError(
                    f"model '{self.model}': no sequence slot freed in time (all "
                    f"{self.sequence_policy.slots} taken); timeout of the corresponding "
                    "sequence has been expired"
                ),
            )
        for corrid in expired.released:
            self._states.pop(corrid, None)
            logger.info(
                "model %s: sequence %s released after %d us idle",
                self.model,
                corrid,
                self.sequence_policy.max_sequence_idle_us,
            )
        while self._free > 0 and not self._closed:
            steps = self._batcher.take(now)
            if steps is None:
                break
            self._free -= 1
            self._launch(steps)
            now = time.monotonic()  # an inline execution moved the clock on
        self._arm_timer()
        self._check_idle()

    @property
    def inline(self) -> bool:
        """Whether batches run on the event loop (measured cheaper than the hand-off to a
        thread, as in the dynamic scheduler), not on the executor."""
        return self._gauge.inline

    def _launch(self, steps: list[Step[_Job]]) -> None:
        held = [None if s.start else self._states.get(s.correlation_id) for s in steps]
        started = time.perf_counter_ns()
        if self.inline:  # completes here; the caller's dispatch loop takes the next batch
            try:
                outcome: _Outcome | BaseException = self._execute(steps, held, started, True)
            except Exception as exc:  # noqa: BLE001 - reported to the requests as BackendError
                outcome = exc
            self._complete(steps, outcome)
            return
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._execute, steps, held, started, False)
        future.add_done_callback(lambda f: self._on_done(steps, f))

    def _execute(
        self,
        steps: list[Step[_Job]],
        held: list[dict[str, np.ndarray] | None],
        started_ns: int,
        on_loop: bool,
    ) -> _Outcome:
        """Run in an executor thread (or inline, `on_loop`): one batch of one request per
        sequence."""
        if steps[0].item.sink is not None:
            return self._execute_decoupled(steps, started_ns)
        cpu_start = time.thread_time_ns()
        run_ns = 0
        results: list[ExecutionResult | BaseException | None] = [None] * len(steps)
        states: list[dict[str, np.ndarray]] = [{} for _ in steps]
        batched = self.tensors.batched
        tensors = self.tensors
        # A backend that takes a batch's requests one by one (Python models, as Triton's Python
        # backend) gets each with its own control and state tensors.
        run_requests = self._run_requests
        for group in self._group_by_shape(steps, held):
            t0 = time.perf_counter_ns()
            requests = [steps[i].item.request for i in group]
            rows = [(steps[i].correlation_id, steps[i].start, steps[i].end) for i in group]
            wanted: dict[str, None] = {}
            for r in requests:
                wanted.update(dict.fromkeys(r.output_names))
            wanted.update(dict.fromkeys(tensors.state_outputs))
            names = list(wanted)
            per_row: list[dict[str, np.ndarray] | BaseException]
            said: list[dict[str, Any] | None] = [None] * len(group)  # response parameters
            if run_requests is not None:
                singles = [
                    (
                        {
                            **r.feeds,
                            **tensors.control_feeds([rows[k]]),
                            **tensors.state_feeds([held[i]]),
                        },
                        names,
                    )
                    for k, (r, i) in enumerate(zip(requests, group, strict=True))
                ]
                t1 = time.perf_counter_ns()
                answers = run_requests(singles, contexts=[r.context for r in requests])
                t2 = time.perf_counter_ns()
                per_row = list(answers)
                said = [response_parameters(a) for a in answers]
            else:
                feeds = (
                    dict(requests[0].feeds)
                    if len(group) == 1
                    else {
                        n: np.concatenate([r.feeds[n] for r in requests]) for n in requests[0].feeds
                    }
                )
                feeds.update(tensors.control_feeds(rows))
                feeds.update(tensors.state_feeds([held[i] for i in group]))
                t1 = time.perf_counter_ns()
                outputs = dict(zip(names, self._backend.run(feeds, names), strict=True))
                t2 = time.perf_counter_ns()
                per_row = [
                    {n: _row(outputs[n], k, batched) for n in names} for k in range(len(group))
                ]
            run_ns += t2 - t1
            for k, i in enumerate(group):
                answer = per_row[k]
                if isinstance(answer, BaseException):
                    results[i] = answer
                    continue
                lost = [n for n in tensors.state_outputs if n not in answer]
                if lost:  # a Python model answers by name: it may leave an output out
                    results[i] = BackendError(
                        f"model '{self.model}' returned no state output '{lost[0]}'"
                    )
                    continue
                requested = requests[k].output_names
                # A Python model's answer keeps its own order (Triton's); `run`'s, the request's.
                named = (
                    [(n, a) for n, a in answer.items() if n in requested]
                    if run_requests is not None
                    else [(n, answer[n]) for n in requested]
                )
                results[i] = ExecutionResult(
                    outputs=[a for _, a in named],
                    queue_ns=max(0, started_ns - steps[i].item.enqueued_ns),
                    compute_input_ns=t1 - t0,
                    compute_infer_ns=t2 - t1,
                    compute_output_ns=0,
                    batch_size=len(group),
                    names=tuple(n for n, _ in named),
                    parameters=said[k],
                )
                states[i] = {
                    n: np.array(answer[n][0] if batched else answer[n])
                    for n in tensors.state_outputs
                }
            t3 = time.perf_counter_ns()
            if self._stats is not None:
                self._stats.record_execution(
                    batch_size=len(group),
                    compute_input_ns=t1 - t0,
                    compute_infer_ns=t2 - t1,
                    compute_output_ns=t3 - t2,
                )
        self._gauge.measured(time.thread_time_ns() - cpu_start, run_ns, on_loop=on_loop)
        return [r for r in results if r is not None], states

    def _execute_decoupled(self, steps: list[Step[_Job]], started_ns: int) -> _Outcome:
        """A decoupled model's batch: one `execute` call, each request with its own control
        tensors; the responses go to the sinks. Implicit state (the outputs of one request are
        the next one's state) is not supported with a model that streams its outputs."""
        run = self._run_decoupled
        if run is None:
            raise BackendError(f"model '{self.model}' cannot run decoupled requests")
        if self.tensors.state_outputs:
            raise UnsupportedError(
                f"model '{self.model}': implicit state is not supported with the decoupled "
                "transaction policy"
            )
        t0 = time.perf_counter_ns()
        requests: list[DecoupledRequest] = []
        for step in steps:
            job = step.item
            assert job.sink is not None  # a decoupled model is reached through streams only
            row = (step.correlation_id, step.start, step.end)
            feeds = {**job.request.feeds, **self.tensors.control_feeds([row])}
            requests.append((feeds, job.request.output_names, job.sink))
        run(requests, contexts=[step.item.request.context for step in steps])
        t1 = time.perf_counter_ns()
        if self._stats is not None:
            self._stats.record_execution(
                batch_size=len(steps), compute_input_ns=0, compute_infer_ns=t1 - t0,
                compute_output_ns=0,
            )  # fmt: skip
        results: list[ExecutionResult | BaseException] = [
            ExecutionResult([], max(0, started_ns - s.item.enqueued_ns), 0, t1 - t0, 0, 1)
            for s in steps
        ]
        return results, [{} for _ in steps]

    def _on_done(self, steps: list[Step[_Job]], future: asyncio.Future[_Outcome]) -> None:
        error = future.exception()
        self._complete(steps, future.result() if error is None else error)
        if not self._closed:
            self._dispatch()
        self._check_idle()

    def _complete(self, steps: list[Step[_Job]], outcome: _Outcome | BaseException) -> None:
        """Settle a batch's requests, keep the state it returned, free its instance."""
        self._free += 1
        if isinstance(outcome, BaseException):
            failure = (
                outcome
                if isinstance(outcome, AgentError)
                else BackendError(f"execution failed: {outcome}")
            )
            for step in steps:
                settle(step.item.future, failure)
        else:
            results, states = outcome
            for step, result, state in zip(steps, results, states, strict=True):
                if not step.end and not isinstance(result, BaseException):
                    self._states[step.correlation_id] = state
                settle(step.item.future, result)
        for corrid in self._batcher.done(steps, time.monotonic()):
            self._states.pop(corrid, None)

    def _group_by_shape(
        self, steps: list[Step[_Job]], held: list[dict[str, np.ndarray] | None]
    ) -> list[list[int]]:
        """Rows can share a batch only when their inputs and states have the same shapes."""
        initial = tuple((s.output_name, s.initial.shape) for s in self.tensors.states)
        groups: dict[tuple[object, ...], list[int]] = {}
        for i, step in enumerate(steps):
            key = tuple((n, a.shape) for n, a in step.item.request.feeds.items())
            state = held[i]
            key += initial if state is None else tuple((n, a.shape) for n, a in state.items())
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def _arm_timer(self) -> None:
        if self._closed:
            return
        # With every instance busy the next batch waits for an execution to finish: a timer
        # for a batch that is already due would only spin.
        deadline = self._batcher.deadline(batches=self._free > 0)
        if self._timer is None:
            if deadline is None:
                return
            self._timer = DeadlineTimer(asyncio.get_running_loop(), self._dispatch)
        self._timer.arm(deadline)

    def _check_idle(self) -> None:
        if not self.pending:
            self._idle.set()


def _row(data: np.ndarray, row: int, batched: bool) -> np.ndarray:
    return data[row : row + 1] if batched else data
