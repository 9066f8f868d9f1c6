"""What every inference backend offers the agent, and what some declare they can do besides.

`Backend` is what every runtime implements: its tensors, `run` and `close`. A backend that can do
more says so by subclassing the capability Protocols below in its class statement, for example

    class PythonBackend(Backend, RunsRequests, RunsDecoupled, DeclaresConfig, HoldsWorkerMemory):

Explicit subclassing is the declaration: the class statement lists what the backend can do, and
mypy checks each method's signature against its Protocol there (a signature that drifts fails the
type check in the backend, not at a distant call). The Protocols are `runtime_checkable` so that
the one place that needs a capability resolves it once, when it is built: the scheduler turns
`isinstance(backend, RunsRequests)` into a typed field at construction (`agent.scheduling`), the
loader reads the load-time facts (`DeclaresConfig`, `ReportsProviders`, `HoldsWorkerMemory`) while
it builds a version. Nothing asks per request: a runtime-checkable `isinstance` costs microseconds
(it looks up every member), and a `getattr(backend, "maybe_method", None)` would hide a misspelt
or mistyped method from the type checker (tests/agent/backends/test_capabilities.py fails if such
a probe comes back on the request path).

We chose declared Protocols over a `capabilities` record on every backend: the declaration sits
where a reader looks first (the class statement), a backend that declares nothing extra needs no
boilerplate, and the implementation is checked against the contract by mypy in both cases.
The load-time facts are plain attributes in their Protocols (a property there would be inherited
by the declaring class as a descriptor without a setter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agent.backends.cancellation import CancelSignal
from agent.backends.health import HealthState
from agent.errors import AgentError
from agent.proto import model_config_pb2 as mc
from agent.tensors.datatypes import ModelTensor
from agent.tensors.request import RequestContext

__all__ = [
    "Backend",
    "DeclaresConfig",
    "DecoupledRequest",
    "HoldsWorkerMemory",
    "ModelOutputs",
    "NamedOutputs",
    "ReleasesMemory",
    "ReportsHealth",
    "ReportsProviders",
    "RequestFeeds",
    "ResponseSink",
    "RunsDecoupled",
    "RunsRequests",
    "response_parameters",
]


class Backend(Protocol):
    """A loaded model version that runs a batch of named tensors."""

    @property
    def inputs(self) -> Sequence[ModelTensor]: ...

    @property
    def outputs(self) -> Sequence[ModelTensor]: ...

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        """Run the model; blocking, called on the model's executor (or inline on the event
        loop once the scheduler measured it as tiny).

        `shrink_memory` asks the runtime to hand unused memory back afterwards (once, after the
        footprint has been measured).
        """
        ...

    def close(self) -> None:
        """Release the runtime's resources."""
        ...


# One request's answer from a backend that runs requests unmerged: the outputs it asked for that
# the model returned, in the model's order (Triton's Python backend leaves out the others and
# keeps the order of the model's response).
NamedOutputs = dict[str, np.ndarray]


class ResponseSink(Protocol):
    """Where a decoupled backend puts one request's responses (from any thread)."""

    def put(self, outputs: NamedOutputs | None, error: AgentError | None, final: bool) -> None:
        """One response (outputs by name, in the model's order, or an error) and/or the final
        flag (outputs None)."""
        ...

    def on_cancel(self, cancel: Callable[[], None]) -> None:
        """Call `cancel` when the client cancels (at once if it already has)."""
        ...


class ModelOutputs(dict[str, np.ndarray]):
    """One request's outputs as `run_requests` answers them (by name, in the model's order),
    with the response parameters the model set (a Python model's
    `InferenceResponse(parameters=...)`)."""

    def __init__(self, outputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> None:
        super().__init__(outputs)
        self.parameters = dict(parameters)


def response_parameters(answer: object) -> dict[str, Any] | None:
    """The response parameters of a `run_requests` answer (None: the model set none)."""
    return answer.parameters if isinstance(answer, ModelOutputs) else None


# One request of a batch, unmerged: its inputs and the outputs it asks for.
RequestFeeds = tuple[Mapping[str, np.ndarray], Sequence[str]]
# One request of a decoupled model: its inputs, the outputs it asks for, where responses go.
DecoupledRequest = tuple[Mapping[str, np.ndarray], Sequence[str], ResponseSink]


@runtime_checkable
class RunsRequests(Protocol):
    """Takes a batch's requests one by one instead of merged (Triton's Python backend: each
    request is its own `InferenceRequest` of one `execute` call)."""

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        """Run the requests of one batch together; each answer is that request's outputs (by
        name, in the model's order, without those it did not return) or its error.
        `cancelled`: one signal per request (or none), set while it runs when its caller went
        away; `traces`: each request's trace (None: untraced), the parent of the requests
        the model makes in turn (BLS); `contexts`: each request's id, parameters and
        correlation id (None or none given: it has none).

        Raises:
            AgentError: the whole batch failed (every request gets the error).
        """
        ...


@runtime_checkable
class StartsRequests(Protocol):
    """A `RunsRequests` backend that can also start a batch from the event loop, without a
    thread (the Python backend: the loop writes to the worker and reads its answer)."""

    def start_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
        executor: Executor,
    ) -> asyncio.Future[list[NamedOutputs | AgentError]] | None:
        """As `run_requests`, called on the event loop and never blocking it: the future of
        the answers (it fails as `run_requests` raises), or None when the batch cannot start
        that way now (then `run_requests` runs on a thread). Whatever must block goes to
        `executor` (the version's, which has a thread for every execution in flight)."""
        ...


@runtime_checkable
class RunsDecoupled(Protocol):
    """Answers a request with any number of responses (Triton's decoupled transaction policy)."""

    def run_decoupled(
        self,
        requests: Sequence[DecoupledRequest],
        *,
        contexts: Sequence[RequestContext | None] = (),
    ) -> None:
        """Run one batch; returns when the instance is free again. Each request's responses go
        to its sink as the model sends them (also after this returned), until its final flag.
        `contexts`: each request's id, parameters and correlation id (as `run_requests`).

        Raises:
            AgentError: the instance failed before the requests were taken.
        """
        ...


@runtime_checkable
class ReleasesMemory(Protocol):
    """Can hand memory it keeps for reuse back to the system (ONNX Runtime's arena)."""

    def release_memory(self) -> None:
        """Shrink what the runtime holds beyond what it uses; blocking, called on the model's
        executor once the model is idle after a burst (`agent.scheduling.memory_release`).

        Raises:
            AgentError: the runtime failed (the release is skipped; serving goes on).
        """
        ...


@runtime_checkable
class DeclaresConfig(Protocol):
    """Completed or extended the model config itself while loading (a Python model's
    `auto_complete_config`, a TensorRT engine's own tensors); the loader completes and serves
    `declared_config` instead of the config it passed in."""

    declared_config: mc.ModelConfig


@runtime_checkable
class ReportsProviders(Protocol):
    """Runs on execution providers the agent reports (the log, the repository index)."""

    providers: tuple[str, ...]  # in use, in order of preference
    missing_providers: tuple[str, ...]  # asked for by the config, not in this runtime


@runtime_checkable
class HoldsWorkerMemory(Protocol):
    """Runs the model in processes of its own, whose memory the agent's RSS does not show (the
    memory budget reserves it)."""

    @property
    def worker_rss_bytes(self) -> int:
        """Resident memory of the backend's worker processes now."""
        ...


@runtime_checkable
class CountsExtraRuns(Protocol):
    """Holds memory for more concurrent runs than it has instances (ONNX Runtime's lone-run
    session: its arena beside the instances'); the memory plan counts them."""

    extra_runs: int  # runs beyond one per instance


@runtime_checkable
class ReportsHealth(Protocol):
    """Its instances can fail while serving and be restarted (`agent.backends.health`): Python
    workers, ONNX Runtime and TensorRT sessions. The registry reads `health` for readiness and
    the repository index; a backend without it is healthy for as long as it is loaded."""

    @property
    def health(self) -> HealthState:
        """Which instances serve now (one frozen snapshot, replaced on each change)."""
        ...
