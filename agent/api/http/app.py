"""KServe v2 HTTP/REST on aiohttp: `create_app` builds the whole app, and the health, metadata,
statistics and canary handlers live here.

Handlers are thin: parse with `agent.api.http.codec`, call `agent.serving.dataplane`, serialize.
The other handlers live beside this: `agent.api.http.infer` (`/infer`, shared with the infer
lane), `agent.api.http.generate`, `agent.api.http.repository` (model repository and versions),
`agent.api.http.settings` (trace, logging), `agent.api.http.shared_memory`, and the status page
(`agent.api.status_page`).

What a request meets before its handler is decided by one `HttpPolicy`
(`agent.api.http.policy`) that both front doors hold: aiohttp's, through the one middleware
(`agent.api.http.middleware`), and the infer lane (`agent.api.http.lane`). `create_app` makes
the policy, the lane, the middleware and the connection guard (`agent.api.http.connection`)
together, so nothing is added to the app afterwards: a listener only binds the guard and serves.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from agent.api.access import ApiAccess
from agent.api.http import repository, settings
from agent.api.http import shared_memory as shm
from agent.api.http.connection import CONNECTION_GUARD, ConnectionGuard
from agent.api.http.context import (
    DATAPLANE,
    TENSOR_LIMITS,
    dataplane_of,
    json_answer,
    json_status,
    optional_json,
    target,
)
from agent.api.http.generate import generate_routes
from agent.api.http.infer import infer_handler
from agent.api.http.lane import INFER_LANE, INFER_ROUTE, InferLane
from agent.api.http.limits import ConnectionLimits
from agent.api.http.middleware import request_middleware
from agent.api.http.policy import HTTP_POLICY, HttpPolicy
from agent.api.openapi import openapi_bytes
from agent.api.status_page import STATUS_SOURCE, BasicStatus, StatusSource, status_routes
from agent.canary.control import policy_from_request
from agent.errors import ModelNotFoundError
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import DEFAULT_MAX_BYTES_ELEMENTS, TensorLimits

__all__ = ["create_app"]


def create_app(
    dataplane: DataPlane,
    *,
    max_request_bytes: int,
    max_bytes_elements: int = DEFAULT_MAX_BYTES_ELEMENTS,
    limits: ConnectionLimits | None = None,
    access: ApiAccess | None = None,
    status: StatusSource | None = None,
    status_token: Callable[[], str | None] | None = None,
    infer_lane: bool = True,
) -> web.Application:
    """Build the whole HTTP application around a data plane.

    Args:
        dataplane: what every handler calls.
        max_request_bytes: the largest body (413 above), also aiohttp's `client_max_size`.
        max_bytes_elements: the most elements of one BYTES input.
        limits: the connection cap and timeouts (`body_timeout_s` is the policy's; None: the
            defaults).
        access: restricted API groups (`agent.api.access`; None: none checked).
        status: the status page's source (None: the data plane's own figures).
        status_token: gives the status page's token in force (None: open).
        infer_lane: serve `/infer` in its commonest shape straight from the connection
            (`agent.api.http.lane`).

    Returns:
        The app, with its `HTTP_POLICY`, `CONNECTION_GUARD` and (with the lane) `INFER_LANE`.
    """
    limits = limits if limits is not None else ConnectionLimits()
    policy = HttpPolicy(
        max_request_bytes=max_request_bytes,
        body_timeout_s=limits.body_timeout_s,
        access=access,
        status_token=status_token,
        # None in the tools that build the app without a data plane (the OpenAPI walk)
        inflight=dataplane.inflight if dataplane is not None else None,
    )
    app = web.Application(
        middlewares=[request_middleware(policy)],
        client_max_size=max_request_bytes,
    )
    app[DATAPLANE] = dataplane
    app[HTTP_POLICY] = policy
    app[TENSOR_LIMITS] = TensorLimits(max_request_bytes, max_bytes_elements)
    app[STATUS_SOURCE] = status if status is not None else BasicStatus(dataplane)
    lane = InferLane(dataplane, app[TENSOR_LIMITS], policy) if infer_lane else None
    if lane is not None:
        app[INFER_LANE] = lane
    app[CONNECTION_GUARD] = ConnectionGuard(limits, lane)
    model = "/v2/models/{model}"
    # Triton's routes take only digits as a version: "/versions/x" matches no route (404).
    version = "/v2/models/{model}/versions/{version:[0-9]+}"
    repo = "/v2/repository/models/{model}"
    system, cuda = "/v2/systemsharedmemory", "/v2/cudasharedmemory"
    app.add_routes(
        [
            # Inference first: the router tries routes in order, and this is the hot path.
            web.post(INFER_ROUTE, infer_handler),
            web.post(version + "/infer", infer_handler),  # lane.VERSION_INFER_ROUTE, digits only
            # Triton's generate extension: generate, generate_stream (agent.api.http.generate).
            *generate_routes(dataplane, model, version),
            web.get("/v2/health/live", _live),
            web.get("/v2/health/ready", _ready),
            web.get("/v2", _server_metadata),
            web.get("/v2/openapi.json", _openapi),
            web.get("/v2/models/stats", _statistics),
            web.get(model, _model_metadata),
            web.get(version, _model_metadata),
            web.get(model + "/ready", _model_ready),
            web.get(version + "/ready", _model_ready),
            web.get(model + "/config", _model_config),
            web.get(version + "/config", _model_config),
            web.get(model + "/stats", _statistics),
            web.post(model + "/canary", _canary_start),
            web.get(model + "/canary", _canary_status),
            web.delete(model + "/canary", _canary_stop),
            web.get(version + "/stats", _statistics),
            web.post("/v2/repository/index", repository.index),
            web.post(repo + "/load", repository.load),
            web.post(repo + "/unload", repository.unload),
            web.get(repo + "/versions", repository.cached_versions),
            web.post(repo + "/versions/{version}/activate", repository.activate),
            web.post(repo + "/rollback", repository.rollback),
            web.post(repo + "/clear-rejected", repository.clear_rejected),
            web.get("/v2/trace/setting", settings.trace_setting),
            web.post("/v2/trace/setting", settings.trace_setting),
            web.get(model + "/trace/setting", settings.trace_setting),
            web.post(model + "/trace/setting", settings.trace_setting),
            web.get("/v2/logging", settings.log_settings),
            web.post("/v2/logging", settings.update_log_settings),
            web.get(system + "/status", shm.system_status),
            web.get(system + "/region/{region}/status", shm.system_status),
            web.post(system + "/region/{region}/register", shm.system_register),
            web.post(system + "/unregister", shm.system_unregister),
            web.post(system + "/region/{region}/unregister", shm.system_unregister),
            # CUDA shared memory, as Triton without GPU support answers it (issue 26)
            web.get(cuda + "/status", shm.cuda_status),
            web.get(cuda + "/region/{region}/status", shm.cuda_status),
            web.post(cuda + "/region/{region}/register", shm.cuda_register),
            web.post(cuda + "/unregister", shm.cuda_unregister),
            web.post(cuda + "/region/{region}/unregister", shm.cuda_unregister),
            *status_routes(),
        ]
    )
    return app


# Health bodies are the Open Inference Protocol's ({"live": true}, {"ready": true}, and name and
# ready for a model): KServe's SDK reads them; Triton's clients read only the status. Not ready
# is Triton's answer (the protocol's "4xx"): 400, empty for the server, its text for a model,
# whether the model is unknown, not loaded or failed: probes and tritonclient expect it.
MODEL_NOT_READY = "Model version not ready"


async def _live(request: web.Request) -> web.Response:
    ok = dataplane_of(request).server_live()
    return json_status({"live": ok}, 200 if ok else 503)


async def _ready(request: web.Request) -> web.Response:
    if dataplane_of(request).server_ready():
        return json_status({"ready": True}, 200)
    return web.Response(status=400)


async def _server_metadata(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).server_metadata())


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_bytes(), content_type="application/json")


async def _model_metadata(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).model_metadata(*target(request)))


async def _model_ready(request: web.Request) -> web.Response:
    try:
        ready = dataplane_of(request).model_ready(*target(request))
    except ModelNotFoundError:
        ready = False
    if ready:
        return json_status({"name": request.match_info["model"], "ready": True}, 200)
    return json_status({"error": MODEL_NOT_READY}, 400)


async def _model_config(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).model_config(*target(request)))


async def _statistics(request: web.Request) -> web.Response:
    name = request.match_info.get("model")
    return json_answer(dataplane_of(request).statistics(name, request.match_info.get("version")))


async def _canary_start(request: web.Request) -> web.Response:
    """Body: {"version": N, "share": 0.1, ...} (see `agent.canary.policy.parse_policy`)."""
    policy = policy_from_request(await optional_json(request))
    return json_answer(dataplane_of(request).canary.start(request.match_info["model"], policy))


async def _canary_status(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).canary.status(request.match_info["model"]))


async def _canary_stop(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).canary.stop(request.match_info["model"]))
