"""Run an ensemble: its steps as a DAG inside the agent, each through its model's own scheduler.

Tensors stay numpy arrays between steps (no serialization). A step starts as soon as every tensor
it reads exists, so independent branches run concurrently. Each step is an ordinary inference on
its composing model through the `StepRunner` the data plane binds (its `infer`): the step's
model batches it with other traffic, records it in its own statistics and metrics (the per-step
figures), and honours hot swaps and canaries like any request. The ensemble records the whole
request in its own statistics. A traced ensemble request hands its trace to each step's request,
whose trace becomes its child.

The first failing step stops the ensemble: no new step starts, those running finish, and the
error names the step; its type is kept (a composing model that is not ready stays a 503) except
that runtime failures become plain `BackendError`s, so that a composing model's broken instance
is never mistaken for the ensemble's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from agent.backends.base import ResponseSink
from agent.ensemble.plan import EnsemblePlan, EnsembleStep
from agent.ensemble.streaming import step_error, step_request, stream_ensemble
from agent.errors import AgentError, ModelControlError, ModelNotReadyError
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.protocol import ExecutionResult, KeepsSequences
from agent.scheduling.sequence_policy import SequenceRequest
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.request import InferRequest, InferResponse
from agent.tensors.signature import ValidatedRequest


class StepRunner(Protocol):
    """The data plane's `infer`: `refusal` words the error for a decoupled model."""

    def __call__(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        /,
        *,
        refusal: str | None = None,
    ) -> Awaitable[InferResponse]: ...


class StreamItem(Protocol):
    """One response of a streamed request (the data plane's `StreamedResponse`)."""

    @property
    def response(self) -> InferResponse | None: ...
    @property
    def error(self) -> AgentError | None: ...
    @property
    def final(self) -> bool: ...


# The data plane's `infer_stream`: every response of a request, for any model (closing it early
# cancels the request).
StreamRunner = Callable[[str, str | None, InferRequest], AsyncGenerator[StreamItem, None]]
# Gets each response of a streamed BLS request (on the event loop): outputs, error, final.
OnItem = Callable[[InferResponse | None, AgentError | None, bool], None]


class StepRunnerSlot:
    """Where the data plane plugs in its `infer` once it exists (models load before it).

    Ensembles call it on the event loop; Python models' BLS requests come from executor threads
    (`submit_threadsafe`), onto the loop the data plane was bound on.
    """

    def __init__(self) -> None:
        self.runner: StepRunner | None = None
        self.stream_runner: StreamRunner | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, runner: StepRunner, stream_runner: StreamRunner | None = None) -> None:
        """Plug in `runner` (and `stream_runner`, for streamed BLS requests); called on the
        agent's event loop, which BLS requests then use."""
        self.runner = runner
        self.stream_runner = stream_runner
        with contextlib.suppress(RuntimeError):  # no loop running: BLS stays unavailable
            self.loop = asyncio.get_running_loop()

    def get(self, ensemble: str) -> StepRunner:
        if self.runner is None:
            raise ModelNotReadyError(f"ensemble '{ensemble}' is not connected to a data plane")
        return self.runner

    def submit_threadsafe(
        self,
        model: str,
        version: str | None,
        request: InferRequest,
        *,
        refusal: str | None = None,
    ) -> concurrent.futures.Future[InferResponse]:
        """Run `request` through the data plane from another thread (a BLS request);
        `refusal`: the error's wording when the model is decoupled.

        Raises:
            ModelNotReadyError: no data plane is bound (yet) on an event loop.
        """
        runner, loop = self.runner, self.loop
        if runner is None or loop is None:
            raise ModelNotReadyError(f"model '{model}': BLS is not connected to a data plane")

        async def call() -> InferResponse:
            return await runner(model, version, request, refusal=refusal)

        return asyncio.run_coroutine_threadsafe(call(), loop)

    def stream_threadsafe(
        self, model: str, version: str | None, request: InferRequest, on_item: OnItem
    ) -> concurrent.futures.Future[None]:
        """Stream `request` through the data plane from another thread (a BLS request with
        `decoupled=True`): `on_item` gets each response; the future ends with the stream, or
        with the error that kept the request from starting. Cancelling it cancels the request.

        Raises:
            ModelNotReadyError: no data plane is bound (yet) on an event loop.
        """
        runner, loop = self.stream_runner, self.loop
        if runner is None or loop is None:
            raise ModelNotReadyError(f"model '{model}': BLS is not connected to a data plane")

        async def call() -> None:
            responses = runner(model, version, request)
            try:
                async for item in responses:
                    on_item(item.response, item.error, item.final)
            finally:
                await responses.aclose()

        return asyncio.run_coroutine_threadsafe(call(), loop)


class EnsembleScheduler:
    """The ensemble's `Scheduler` (`agent.scheduling.protocol`): its steps run on the composing
    models' own schedulers."""

    sequences: KeepsSequences | None = None  # a stateful step's sequence is kept by its model

    def __init__(
        self,
        plan: EnsemblePlan,
        version: int,
        policy: BatchingPolicy,
        slot: StepRunnerSlot,
        stats: ModelStatistics | None = None,
    ) -> None:
        self.model = plan.name
        self.version = version
        self.plan = plan
        self.policy = policy
        self._slot = slot
        self._stats = stats  # the ensemble's own: one execution per request run, as Triton
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def pending(self) -> int:
        return self._in_flight

    def set_policy(self, policy: BatchingPolicy) -> None:
        raise ModelControlError(
            f"ensemble '{self.model}' has no batcher of its own: set batching on its composing "
            f"models ({', '.join(self.plan.composing_models)})"
        )

    async def submit(
        self,
        request: ValidatedRequest,
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        sequence: SequenceRequest | None = None,
        responses: ResponseSink | None = None,
    ) -> ExecutionResult:
        """Run every step and return the requested ensemble outputs.

        `responses` (a decoupled ensemble, `ensemble_stream`): each set of ensemble outputs goes
        there as one response, then the final flag; the result then holds no outputs.

        `sequence` (a stateful step's correlation id and flags) goes to every step, as Triton
        passes it on.

        Raises:
            AgentError: the first failing step's error, its message prefixed with the step.
        """
        if self._closed:
            raise ModelNotReadyError(f"ensemble '{self.model}' version {self.version} is unloading")
        runner = self._slot.get(self.model)
        parameters: dict[str, Any] = {}
        if priority is not None:
            parameters["priority"] = priority
        if timeout_us is not None:
            parameters["timeout"] = timeout_us
        if sequence is not None:
            parameters["sequence_id"] = sequence.correlation_id
            parameters["sequence_start"] = sequence.start
            parameters["sequence_end"] = sequence.end
        self._in_flight += 1
        self._idle.clear()
        started = time.perf_counter_ns()
        try:
            if responses is not None:
                await stream_ensemble(
                    self.model,
                    self.plan,
                    self._slot,
                    request,
                    parameters,
                    lambda outputs: responses.put(outputs, None, False),
                )
                responses.put(None, None, True)
                return ExecutionResult([], 0, 0, time.perf_counter_ns() - started, 0, 1)
            tensors = await self._run_steps(runner, dict(request.feeds), parameters, request.trace)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        result = ExecutionResult(
            outputs=[tensors[name] for name in request.output_names],
            queue_ns=0,
            compute_input_ns=0,
            compute_infer_ns=time.perf_counter_ns() - started,
            compute_output_ns=0,
            batch_size=request.batch_size,
        )
        if self._stats is not None:
            self._stats.record_execution(
                batch_size=result.batch_size,
                compute_input_ns=0,
                compute_infer_ns=result.compute_infer_ns,
                compute_output_ns=0,
            )
        return result

    async def drain(self) -> None:
        while self._in_flight:
            await self._idle.wait()

    def close(self, reason: str = "was unloaded") -> None:
        self._closed = True  # running steps finish; their models fail or serve them

    async def _run_steps(
        self,
        runner: StepRunner,
        tensors: dict[str, np.ndarray],
        parameters: dict[str, Any],
        trace: object | None,
    ) -> dict[str, np.ndarray]:
        waiting = list(self.plan.steps)
        running: dict[asyncio.Task[InferResponse], EnsembleStep] = {}
        failure: BaseException | None = None
        while waiting or running:
            if failure is None:
                for step in [s for s in waiting if all(t in tensors for t in s.inputs.values())]:
                    waiting.remove(step)
                    call = runner(
                        step.model_name,
                        str(step.model_version) if step.model_version > 0 else None,
                        step_request(step, tensors, parameters, trace),
                    )
                    running[asyncio.ensure_future(call)] = step
            if not running:
                break  # only after a failure: the plan guarantees progress otherwise
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                exc = task.exception()
                if exc is not None:
                    failure = failure or step_error(self.model, step, exc)
                    continue
                for output in task.result().outputs:
                    tensors[step.outputs[output.name]] = output.data
        if failure is not None:
            raise failure
        return tensors
