"""KServe v2 `/infer` over HTTP: one request from its body to its response body, the one path of
both front doors (the infer lane, `agent.api.http.lane`, and the aiohttp route `infer_handler`).

Thin, as every handler: decode with `agent.api.http.codec`, call `DataPlane.infer`, encode. A
decoupled model is refused (`REFUSAL`, Triton's wording: use `generate_stream`). The request's
trace, when one is sampled, gets the HTTP stamps and the client's W3C trace context.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from aiohttp import web

from agent.api.http.codec import HEADER_LENGTH, decode_infer_request, encode_infer_response
from agent.api.http.context import DATAPLANE, TENSOR_LIMITS, target
from agent.api.http.limits import read_body
from agent.errors import InvalidInputError
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

__all__ = ["REFUSAL", "answer_infer", "infer_handler"]

# A JSON part larger than this is decoded on a worker thread, so a 57 MiB body (about 0.6 s of
# parsing) does not stall every other client on the event loop; smaller ones stay inline (the
# thread hop costs more than their parse). One thread for all of them: parsing holds the GIL,
# and every thread that does competes with the event loop for it, so large bodies queue there
# instead of each taking its share of the loop's time.
OFF_LOOP_JSON_BYTES = 1 << 20
_LARGE_JSON = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-json")

# Triton's answer to /infer on a decoupled model (501).
REFUSAL = "HTTP end point doesn't support models with decoupled transaction policy"


async def answer_infer(
    dataplane: DataPlane,
    limits: TensorLimits,
    target: tuple[str, str | None],
    body: bytes | memoryview,
    header_length: int | None,
    headers: Mapping[str, str],
    received_ns: int,
) -> tuple[bytes, int | None]:
    """One `/infer` request, from its body to the response body and its JSON header's length
    (None: all JSON).

    `headers` are read for the trace context only; `received_ns` is the HTTP_RECV_START stamp.
    Raises the data plane's and the codec's `AgentError`s.
    """
    json_bytes = len(body) if header_length is None else header_length
    if json_bytes > OFF_LOOP_JSON_BYTES:  # about 10 ms a MiB: not on the loop others wait on
        infer_request = await asyncio.get_running_loop().run_in_executor(
            _LARGE_JSON, partial(decode_infer_request, body, header_length, limits=limits)
        )
    else:
        infer_request = decode_infer_request(body, header_length, limits=limits)
    tracer = dataplane.tracer
    trace = tracer.start(target[0], infer_request.id or "") if tracer.active else None
    if trace is None:
        response = await dataplane.infer(*target, infer_request, refusal=REFUSAL)
        return encode_infer_response(response, infer_request)
    trace.stamp("HTTP_RECV_START", received_ns)
    trace.stamp("HTTP_RECV_END")
    trace.propagate(headers)
    try:
        response = await dataplane.infer(*target, infer_request, trace, refusal=REFUSAL)
        trace.stamp("HTTP_SEND_START")
        answer = encode_infer_response(response, infer_request)
        trace.stamp("HTTP_SEND_END")
        return answer
    finally:
        tracer.finish(trace)


async def infer_handler(request: web.Request) -> web.Response:
    """The aiohttp route of `/infer`: a connection the infer lane handed over, or a listener
    without the lane (its body was read up front by the middleware, within the policy)."""
    received = time.perf_counter_ns()
    app = request.app
    header_length = _header_length(request)
    body = await read_body(request)
    payload, json_length = await answer_infer(
        app[DATAPLANE],
        app[TENSOR_LIMITS],
        target(request),
        body,
        header_length,
        request.headers,
        received,
    )
    if json_length is None:
        return web.Response(body=payload, content_type="application/json")
    return web.Response(
        body=payload,
        content_type="application/octet-stream",
        headers={HEADER_LENGTH: str(json_length)},
    )


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInputError(f"{HEADER_LENGTH} must be an integer, got {raw!r}") from None
