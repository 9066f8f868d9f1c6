"""What every HTTP handler reads from its request and application, and how it answers JSON:
the data plane, the addressed model, an optional JSON body, a version number in a path."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from agent.api.http.limits import read_body
from agent.errors import InvalidInputError
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import TensorLimits

DATAPLANE = web.AppKey("dataplane", DataPlane)
TENSOR_LIMITS = web.AppKey("tensor_limits", TensorLimits)


def dataplane_of(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def target(request: web.Request) -> tuple[str, str | None]:
    return request.match_info["model"], request.match_info.get("version")


def json_answer(body: Any) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")), content_type="application/json"
    )


def json_status(body: dict[str, Any], status: int) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )


def version_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # not "²" (a digit)
        raise InvalidInputError(f"version must be a positive integer, got {text!r}")
    return int(text)


async def optional_json(request: web.Request) -> dict[str, Any]:
    body = await read_body(request)
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise InvalidInputError(f"malformed JSON in request: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object")
    return doc
