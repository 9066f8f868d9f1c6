"""The traces of inference requests on the data plane: a request's own or its parent's child,
its tensor entries, and its end.

A request with a `parent_trace` (an ensemble step, a BLS request of a traced Python model) is
traced as its parent's child and finished here, since no transport finishes it; so is a streamed
request's trace, which the transport never sees end. A unary request's own trace is started and
finished by its transport (`agent.tracing.tracer`).
"""

from __future__ import annotations

from dataclasses import replace

from agent.tensors.request import InferRequest, OutputTensor
from agent.tensors.signature import ModelSignature, ValidatedRequest
from agent.tracing.tensors import BACKEND_INPUT, BACKEND_OUTPUT, QUEUE_INPUT
from agent.tracing.tracer import Trace, Tracer

__all__ = ["RequestTraces"]


class RequestTraces:
    """Starts, fills and ends the traces of the requests the data plane runs."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def child(self, name: str, request: InferRequest) -> Trace | None:
        """The trace of a request to `name` made by a traced request (its `parent_trace`)."""
        parent = request.parent_trace
        if not isinstance(parent, Trace):
            return None
        return self.tracer.spawn(parent, name, request.id or "")

    def stream(self, name: str, request: InferRequest) -> Trace | None:
        """A streamed request's trace: the child of the request that made it (an ensemble step,
        a BLS call), or its own when the settings sample it."""
        if request.parent_trace is not None:
            return self.child(name, request)
        if self.tracer.active:
            return self.tracer.start(name, request.id or "")
        return None

    @staticmethod
    def inputs(
        trace: Trace, request: InferRequest, valid: ValidatedRequest, signature: ModelSignature
    ) -> ValidatedRequest:
        """The inputs' tensor entries (level TENSORS); the validated request carries its trace
        on, so that an ensemble's steps and a Python model's BLS requests become its children."""
        if trace.tensors:
            for tensor in request.inputs:
                trace.tensor(QUEUE_INPUT, tensor.name, tensor.datatype, tensor.data)
            for name, data in valid.feeds.items():
                contract = signature.inputs.get(name)
                datatype = contract.datatype if contract is not None else ""
                trace.tensor(BACKEND_INPUT, name, datatype, data)
        return replace(valid, trace=trace)

    def end(self, trace: Trace, outputs: tuple[OutputTensor, ...] | tuple[()]) -> None:
        """A unary request ended (answered or failed): its output entries, and a child's trace
        finished (a request's own trace is finished by its transport)."""
        if trace.tensors:
            for tensor in outputs:
                trace.tensor(BACKEND_OUTPUT, tensor.name, tensor.datatype, tensor.data)
        trace.stamp("REQUEST_END")
        if trace.parent is not None:  # a child: no transport finishes it
            self.tracer.finish(trace)

    def stream_end(self, trace: Trace) -> None:
        """A streamed request ended (final flag, failure or the client gone): keep its trace (no
        transport finishes a stream's trace)."""
        trace.stamp("REQUEST_END")
        self.tracer.finish(trace)
