"""Triton's model-repository extension over HTTP (index, load with an optional config or files,
unload) and the agent's version control of a model cache (cached versions, activate, rollback,
clear-rejected). Thin: `agent.serving.model_control` does the work."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from aiohttp import web

from agent.api.http.context import dataplane_of, json_answer, optional_json, version_number
from agent.api.http.limits import read_body
from agent.api.model_load import invalid_override, load_model
from agent.errors import InvalidInputError
from agent.models.pushed import FILE_PREFIX


async def index(request: web.Request) -> web.Response:
    ready_only = False
    body = await read_body(request)
    if body.strip():
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise InvalidInputError(f"malformed JSON in request: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
            raise InvalidInputError('repository index body must be {"ready": true|false}')
        ready_only = doc.get("ready", False)
    return json_answer(dataplane_of(request).repository_index(ready_only))


async def load(request: web.Request) -> web.Response:
    """Triton's load: an optional body {"parameters": {"config": "<model config JSON>",
    "file:<path>": "<base64>"...}}."""
    doc = await optional_json(request)
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError("'parameters' must be an object")
    config: dict[str, Any] | None = None
    raw = params.get("config")
    if raw is not None:
        try:
            config = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            name = request.match_info["model"]
            raise invalid_override(name, f"parameter 'config' is not valid JSON: {exc}") from None
        if not isinstance(config, dict):
            name = request.match_info["model"]
            raise invalid_override(name, "parameter 'config' must be a JSON object")
    # --- load with files (Triton's "file:<path>" parameters, base64 in JSON) ---
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if key == "config":
            continue
        if not key.startswith(FILE_PREFIX):
            raise InvalidInputError(f"unrecognized load parameter '{key}'.")
        if not isinstance(value, str):
            raise InvalidInputError(f"File parameter '{key}' must be a base64-encoded string")
        try:
            files[key] = base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise InvalidInputError(f"File parameter '{key}' is not valid base64: {exc}") from None
    await load_model(dataplane_of(request), request.match_info["model"], config, files)
    # --- end load with files ---
    return web.Response(status=200)


async def unload(request: web.Request) -> web.Response:
    await optional_json(request)
    await dataplane_of(request).unload_model(request.match_info["model"])
    return web.Response(status=200)


async def cached_versions(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).cached_versions(request.match_info["model"]))


async def activate(request: web.Request) -> web.Response:
    await optional_json(request)
    version = version_number(request.match_info["version"])
    strategy = await dataplane_of(request).activate_version(request.match_info["model"], version)
    return json_answer(
        {"model": request.match_info["model"], "version": version, "strategy": strategy}
    )


async def rollback(request: web.Request) -> web.Response:
    """Body {"version": N} picks the version; without it, the one served before."""
    doc = await optional_json(request)
    raw = doc.get("version")
    version = None if raw is None else version_number(str(raw))
    done = await dataplane_of(request).rollback(request.match_info["model"], version)
    return json_answer({"model": request.match_info["model"], "version": done})


async def clear_rejected(request: web.Request) -> web.Response:
    """Body {"version": N} lifts one version's rejection; without it, all of the model's."""
    doc = await optional_json(request)
    raw = doc.get("version")
    version = None if raw is None else version_number(str(raw))
    model = request.match_info["model"]
    cleared = await dataplane_of(request).clear_rejected(model, version, by="clear-rejected")
    return json_answer({"model": model, "cleared": cleared})
