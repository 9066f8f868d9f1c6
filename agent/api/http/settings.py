"""Triton's trace and logging extensions over HTTP: read and change the trace settings (global or
one model's) and the log settings."""

from __future__ import annotations

from aiohttp import web

from agent.api.http.context import dataplane_of, json_answer, optional_json


async def trace_setting(request: web.Request) -> web.Response:
    """Triton's trace extension; POST body: the settings to change, e.g. {"trace_rate": "1"}."""
    changes = await optional_json(request) if request.method == "POST" else None
    return json_answer(
        dataplane_of(request).trace_setting(request.match_info.get("model"), changes)
    )


async def log_settings(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).log_settings.get())


async def update_log_settings(request: web.Request) -> web.Response:
    """Body: the settings to change, e.g. {"log_verbose_level": 1} (Triton's logging extension)."""
    changes = await optional_json(request)
    return json_answer(dataplane_of(request).log_settings.update(changes))
