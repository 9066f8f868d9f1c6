"""A decoupled model's request on the data plane: queue it with a `ResponseStream`, yield its
responses as the model sends them, count it once the final flag came.

Statistics, as Triton counts a decoupled request: one success (or failure, when any response
carried an error or the client cancelled) once its final flag came, its request duration from
arrival to that flag; each response in `response_stats` under its index.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator

from agent.backends.base import response_parameters
from agent.errors import AgentError, BackendError, InternalError, ModelInstanceFailedError
from agent.models.served import LoadedVersion, ServedModel
from agent.scheduling.protocol import ExecutionResult
from agent.scheduling.sequence_policy import SequenceRequest
from agent.scheduling.statistics import FailureReason, ResponseKind
from agent.serving.response_stream import RawResponse, ResponseStream, StreamedResponse
from agent.tensors import datatypes
from agent.tensors.request import InferResponse, OutputTensor
from agent.tensors.signature import ModelSignature, ValidatedRequest


async def stream_responses(
    served: ServedModel,
    loaded: LoadedVersion,
    valid: ValidatedRequest,
    request_id: str | None,
    *,
    priority: int | None,
    timeout_us: int | None,
    start_ns: int,
    sequence: SequenceRequest | None = None,
) -> AsyncGenerator[StreamedResponse, None]:
    """Run a validated request on a decoupled model version; its responses as they come.

    Raises:
        AgentError: the request failed before the model took it (queue full or timed out,
            version unloaded, instance failed), with nothing yielded yet.
    """
    stream = ResponseStream(asyncio.get_running_loop())
    submitting = loaded.scheduler.submit(
        valid, priority=priority, timeout_us=timeout_us, sequence=sequence, responses=stream
    )
    submitted = asyncio.ensure_future(submitting)
    submitted.add_done_callback(lambda task: _end_on_failure(task, stream))
    sig = served.signature
    version = str(loaded.version)
    index = 0
    last_ns = start_ns
    failed: AgentError | None = None
    try:
        async for raw in stream:
            if raw.error is not None and index == 0 and _failed_before_start(submitted):
                failed = raw.error
                raise raw.error
            item = _item(raw, served.name, version, request_id, sig)
            now = time.perf_counter_ns()
            if item.error is not None:
                failed = item.error
            if item.response is not None or item.error is not None:
                kind: ResponseKind = "fail" if item.error is not None else "success"
                loaded.stats.record_response(index, kind, ns=now - last_ns)
                index += 1
            else:  # the final flag alone
                loaded.stats.record_response(index, "empty_response", ns=now - last_ns)
            last_ns = now
            yield item
    finally:
        if not stream.finished:  # the client went away (or the request failed to start)
            stream.cancel()
            if not submitted.done():
                submitted.cancel()
            if failed is None:
                failed = _CANCELLED
                loaded.stats.record_response(index, "cancel", ns=time.perf_counter_ns() - last_ns)
        _count(loaded, submitted, failed, start_ns)


_CANCELLED = InternalError("cancelled by the client")


def _end_on_failure(task: asyncio.Future[ExecutionResult], stream: ResponseStream) -> None:
    """The request never ran (or its instance failed): end the stream with that error."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        stream.put(None, InternalError.wrap(error), True)


def _failed_before_start(submitted: asyncio.Future[ExecutionResult]) -> bool:
    return submitted.done() and not submitted.cancelled() and submitted.exception() is not None


def _item(
    raw: RawResponse,
    model: str,
    version: str,
    request_id: str | None,
    sig: ModelSignature,
) -> StreamedResponse:
    if raw.error is not None or raw.outputs is None:
        return StreamedResponse(None, raw.error, raw.final)
    outputs = tuple(
        OutputTensor(
            n, datatypes.answered(sig.outputs[n].datatype, data), sig.shape_output(n, data)
        )
        for n, data in raw.outputs.items()
    )
    answer = InferResponse(model, version, outputs, request_id, response_parameters(raw.outputs))
    return StreamedResponse(answer, None, raw.final)


def _count(
    loaded: LoadedVersion,
    submitted: asyncio.Future[ExecutionResult],
    failed: AgentError | None,
    start_ns: int,
) -> None:
    now_ms = time.time_ns() // 1_000_000
    request_ns = time.perf_counter_ns() - start_ns
    if failed is not None:
        loaded.stats.record_failure(request_ns=request_ns, reason=_reason(failed), now_ms=now_ms)
        return
    result: ExecutionResult | None = None
    if submitted.done() and not submitted.cancelled() and submitted.exception() is None:
        result = submitted.result()
    with contextlib.suppress(ValueError):
        loaded.stats.record_success(
            request_ns=request_ns,
            queue_ns=result.queue_ns if result else 0,
            compute_input_ns=0,
            compute_infer_ns=min(request_ns, result.compute_infer_ns) if result else 0,
            compute_output_ns=0,
            now_ms=now_ms,
        )


def _reason(error: AgentError) -> FailureReason:
    if error is _CANCELLED:
        return "CANCELED"
    if isinstance(error, BackendError | ModelInstanceFailedError):
        return "BACKEND"
    return "OTHER"
