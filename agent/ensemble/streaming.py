"""A decoupled ensemble's request: each response of a decoupled step flows on, as in Triton.

An ensemble with a decoupled step is decoupled itself (the loader marks its config so). Its
steps run as the plan orders them, each through the data plane like any request; when the next
steps to run include a decoupled one, its responses are read one by one, and each that carries
outputs continues the ensemble on its own copy of the tensors (the later steps, a further
decoupled step forking again), so one request yields as many ensemble responses as its decoupled
steps answer. An upstream response's branch finishes before the next response is taken, so the
ensemble's responses keep the order of the upstream ones. A decoupled step's empty response
(the final flag alone) ends its stream without a branch; its error responses, and any failing
step, end the request with that step's error (no later step starts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.ensemble.plan import EnsemblePlan, EnsembleStep
from agent.errors import AgentError, BackendError, ModelNotReadyError
from agent.tensors.request import InferInput, InferRequest, RequestedOutput
from agent.tensors.signature import ValidatedRequest

if TYPE_CHECKING:
    from agent.ensemble.runner import StepRunnerSlot

# Gets the requested ensemble outputs of one response by name, in the request's order.
Emit = Callable[[dict[str, np.ndarray]], None]


async def stream_ensemble(
    ensemble: str,
    plan: EnsemblePlan,
    slot: StepRunnerSlot,
    request: ValidatedRequest,
    parameters: dict[str, Any],
    emit: Emit,
) -> None:
    """Run the ensemble, `emit`ting its outputs once per path through its decoupled steps.

    Raises:
        AgentError: the first failing step's error, its message prefixed with the step.
    """
    if slot.stream_runner is None:
        raise ModelNotReadyError(f"ensemble '{ensemble}' is not connected to a data plane")

    async def branch(tensors: dict[str, np.ndarray], waiting: list[EnsembleStep]) -> None:
        while waiting:
            ready = [s for s in waiting if all(t in tensors for t in s.inputs.values())]
            plain = [s for s in ready if not s.decoupled]
            step = plain[0] if plain else ready[0]  # the plan guarantees one is ready
            waiting = [s for s in waiting if s is not step]
            if step.decoupled:
                await fork(step, tensors, waiting)
                return
            answer = await run(step, tensors)
            tensors = {**tensors, **answer}
        emit({name: tensors[name] for name in request.output_names})

    async def run(step: EnsembleStep, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        runner = slot.get(ensemble)
        try:
            response = await runner(
                step.model_name,
                _version(step),
                step_request(step, tensors, parameters, request.trace),
            )
        except Exception as exc:
            raise step_error(ensemble, step, exc) from exc
        return {step.outputs[o.name]: o.data for o in response.outputs}

    async def fork(
        step: EnsembleStep, tensors: dict[str, np.ndarray], waiting: list[EnsembleStep]
    ) -> None:
        assert slot.stream_runner is not None
        responses = slot.stream_runner(
            step.model_name, _version(step), step_request(step, tensors, parameters, request.trace)
        )
        try:
            async for item in responses:
                if item.error is not None:
                    raise step_error(ensemble, step, item.error)
                if item.response is not None:
                    answer = {step.outputs[o.name]: o.data for o in item.response.outputs}
                    await branch({**tensors, **answer}, waiting)
        except AgentError as exc:
            raise step_error(ensemble, step, exc) from exc
        finally:
            await (
                responses.aclose()
            )  # closing early (a failure, a cancel) cancels the step's request

    await branch(dict(request.feeds), list(plan.steps))


def _version(step: EnsembleStep) -> str | None:
    return str(step.model_version) if step.model_version > 0 else None


def step_request(
    step: EnsembleStep,
    tensors: dict[str, np.ndarray],
    parameters: dict[str, Any],
    trace: object | None,
) -> InferRequest:
    """A step's request: its inputs from the ensemble's tensors, every output it maps."""
    inputs = tuple(
        InferInput(
            model_input,
            step.input_specs[model_input].datatype,
            tuple(int(d) for d in tensors[tensor].shape),
            tensors[tensor],
        )
        for model_input, tensor in step.inputs.items()
    )
    outputs = tuple(RequestedOutput(name) for name in step.outputs)
    # A traced ensemble's steps are traced as its children (Triton's parent_id).
    return InferRequest(inputs, outputs=outputs, parameters=parameters, parent_trace=trace)


def step_error(ensemble: str, step: EnsembleStep, exc: BaseException) -> BaseException:
    """A step's failure as the ensemble's: named after the step; runtime failures become plain
    `BackendError`s (a composing model's broken instance is not the ensemble's own)."""
    if not isinstance(exc, AgentError):
        return exc
    if exc.message.startswith(f"ensemble '{ensemble}' "):
        return exc  # named already (by a nested branch)
    message = f"ensemble '{ensemble}' {step.label}: {exc.message}"
    if isinstance(exc, BackendError):
        return BackendError(message)
    return type(exc)(message)
