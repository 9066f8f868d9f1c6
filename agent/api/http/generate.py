"""Triton's generate extension: `POST v2/models/{m}[/versions/{v}]/generate[_stream]`.

The request is one JSON object. Each key naming one of the model's inputs (at the top level or
inside "parameters") becomes that input: a scalar or a (nested) list, of the input's datatype;
its shape is the model's with each variable dimension filled (the last one takes what the
element count asks, the others 1; a batched model gets a batch of 1). Every other key, and the
rest of "parameters", are request parameters (string, number or boolean).

A response is `{"model_name", "model_version", <output>: value ...}`: one element as a scalar,
more as a flat list, BYTES as text.

* `/generate` answers exactly one response as `application/json`; a decoupled model that sends
  none or several is an error (use `/generate_stream`).
* `/generate_stream` answers every response as a server-sent event (`data: {...}`), errors
  included (`data: {"error": "..."}`) once the stream has started. A request that fails
  before the model takes it is an ordinary JSON error with its status. A client that closes the
  connection cancels the request (the model's `request.is_cancelled()` turns true).

Both serve any model; `/infer` refuses decoupled models (`agent.api.http.infer.REFUSAL`).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web

from agent.api.http.codec import tensor_from_json, tensor_to_json
from agent.errors import AgentError, InvalidInputError
from agent.serving.dataplane import DataPlane
from agent.serving.response_stream import StreamedResponse
from agent.tensors.request import InferInput, InferRequest, InferResponse


def generate_routes(dataplane: DataPlane, model: str, version: str) -> list[web.RouteDef]:
    """The four generate routes (model and model-version, one-shot and streaming)."""

    async def generate(request: web.Request) -> web.Response:
        name, number = _target(request)
        infer_request = await _decode(request, dataplane, name, number)
        responses: list[InferResponse] = []
        async for item in dataplane.infer_stream(name, number, infer_request):
            if item.error is not None:
                raise item.error
            if item.response is not None:
                responses.append(item.response)
        if len(responses) != 1:
            raise InvalidInputError(
                f"model '{name}' sent {len(responses)} responses; generate answers exactly one "
                "(use generate_stream)"
            )
        return web.Response(
            body=json.dumps(_encode(responses[0]), separators=(",", ":")),
            content_type="application/json",
        )

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        name, number = _target(request)
        infer_request = await _decode(request, dataplane, name, number)
        items = dataplane.infer_stream(name, number, infer_request)
        try:
            # Failures before the model took the request are plain JSON errors (middleware).
            first = await anext(items, None)
            answer = web.StreamResponse(
                headers={"Content-Type": "text/event-stream; charset=utf-8"}
            )
            answer.headers["Cache-Control"] = "no-cache"
            await answer.prepare(request)
            await _write_events(answer, first, items)
        finally:
            await items.aclose()  # before the final item: cancels the request
        return answer

    routes: list[web.RouteDef] = []
    for base in (model, version):
        routes.append(web.post(base + "/generate", generate))
        routes.append(web.post(base + "/generate_stream", generate_stream))
    return routes


async def _write_events(
    answer: web.StreamResponse,
    first: StreamedResponse | None,
    items: AsyncIterator[StreamedResponse],
) -> None:
    item = first
    try:
        while item is not None:
            event = _event(item)
            if event is not None:
                await answer.write(event)
            item = await anext(items, None)
    except ConnectionError:
        return  # the client went away; the caller's aclose cancels the request
    await answer.write_eof()


def _event(item: StreamedResponse) -> bytes | None:
    if item.error is not None:
        body: dict[str, Any] = {"error": item.error.message}
    elif item.response is not None:
        try:
            body = _encode(item.response)
        except AgentError as exc:
            body = {"error": exc.message}
    else:
        return None  # the final flag alone
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _target(request: web.Request) -> tuple[str, str | None]:
    return request.match_info["model"], request.match_info.get("version")


async def _decode(
    request: web.Request, dataplane: DataPlane, name: str, version: str | None
) -> InferRequest:
    """The generate JSON as an inference request for the model's inputs.

    Raises:
        InvalidInputError: not a JSON object, a bad value or parameter.
        ModelNotFoundError, ModelNotReadyError: the model cannot serve.
    """
    try:
        doc = json.loads(await request.read())
    except ValueError as exc:
        raise InvalidInputError(f"malformed JSON in request: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("generate request must be a JSON object")
    nested = doc.pop("parameters", None) or {}
    if not isinstance(nested, dict):
        raise InvalidInputError("'parameters' must be a JSON object")
    meta = dataplane.model_metadata(name, version)
    declared = {str(t["name"]): t for t in meta["inputs"]}
    inputs: list[InferInput] = []
    parameters: dict[str, Any] = {}
    for key, value in [*doc.items(), *nested.items()]:
        tensor = declared.get(key)
        if tensor is not None:
            inputs.append(_input(key, str(tensor["datatype"]), list(tensor["shape"]), value))
        elif isinstance(value, str | int | float | bool):
            parameters[key] = value
        else:
            raise InvalidInputError(
                f"'{key}' is not an input of model '{name}', and a parameter must be a string, "
                "number or boolean"
            )
    if not inputs:
        raise InvalidInputError(f"the request names no input of model '{name}'")
    return InferRequest(tuple(inputs), parameters=parameters)


def _input(name: str, datatype: str, dims: list[int], value: object) -> InferInput:
    count = sum(1 for _ in _leaves(value))
    shape = [1 if d < 0 else d for d in dims]
    variable = [i for i, d in enumerate(dims) if d < 0]
    if variable:
        fixed = math.prod(d for d in dims if d >= 0)
        if fixed and count % fixed == 0:
            shape[variable[-1]] = count // fixed
    values = value if isinstance(value, list) else [value]
    data = tensor_from_json(values, datatype, tuple(shape), name)
    return InferInput(name, datatype, tuple(shape), data)


def _leaves(value: object) -> Iterator[object]:
    if isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _encode(response: InferResponse) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for out in response.outputs:
        values = tensor_to_json(out.data, out.datatype, out.name)
        body[out.name] = values[0] if len(values) == 1 else values
    return body
