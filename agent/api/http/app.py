"""KServe v2 HTTP/REST endpoints on aiohttp: the one route table, the error table, and the
inference, health, metadata, statistics and canary handlers.

Handlers are thin: parse with `agent.api.http.codec`, call `agent.serving.dataplane`, serialize.
The other extensions' handlers live beside this: `agent.api.http.repository` (model repository
and versions), `agent.api.http.settings` (trace, logging), `agent.api.http.shared_memory`.
One middleware (`request_middleware`) checks the status page's token and restricted API groups,
reads the body up front, and maps every error to a status code (`STATUS_FOR_ERROR`, read
through `agent.errors.lookup`) and Triton's `{"error": "..."}` body; an unexpected exception is
logged with its traceback and answered as a JSON 500, never as aiohttp's plain-text page.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.api.access import (
    ApiAccess,
    RestrictedApiError,
    http_endpoint,
)
from agent.api.http import repository, settings
from agent.api.http import shared_memory as shm
from agent.api.http.codec import HEADER_LENGTH
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
from agent.api.http.lane import INFER_LANE, InferLane, answer_infer
from agent.api.http.limits import (
    STOPPING,
    ClientTimeoutError,
    StoppingError,
    must_close,
    read_body,
    read_body_up_front,
)
from agent.api.model_load import ModelLoadFailedError
from agent.api.openapi import openapi_bytes
from agent.api.status_page import (
    STATUS_PATHS,
    STATUS_SOURCE,
    BasicStatus,
    StatusSource,
    status_routes,
)
from agent.api.tls import TlsError
from agent.canary.control import policy_from_request
from agent.errors import (
    AccessDeniedError,
    AgentError,
    BackendError,
    CacheCommitError,
    ConflictError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    ModelConfigError,
    ModelControlDisabledError,
    ModelControlError,
    ModelInstanceFailedError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NoReadyVersionError,
    OverloadedError,
    PayloadTooLargeError,
    RegionExistsError,
    RepositoryPollError,
    RequestTimeoutError,
    SharedMemoryNotFoundError,
    UnsupportedError,
    lookup,
)
from agent.pages import request_token, token_matches, unauthorized
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import DEFAULT_MAX_BYTES_ELEMENTS, TensorLimits

logger = logging.getLogger(__name__)


# The one place where error types become HTTP status codes (every type listed: a test checks).
# The codes are Triton's for the same situation (its HttpCodeFromError: INVALID_ARG 400,
# NOT_FOUND 404, INTERNAL 500, UNAVAILABLE 503).
STATUS_FOR_ERROR: dict[type[AgentError], int] = {
    InvalidInputError: 400,
    ModelControlError: 400,
    ModelConfigError: 400,
    AccessDeniedError: 403,
    RestrictedApiError: 403,  # Triton's answer to a restricted API
    ModelLoadFailedError: 400,
    ModelNotFoundError: 404,
    NoReadyVersionError: 404,
    SharedMemoryNotFoundError: 404,
    ConflictError: 409,
    RegionExistsError: 400,
    ClientTimeoutError: 408,
    PayloadTooLargeError: 413,
    BackendError: 500,
    ModelInstanceFailedError: 500,
    CacheCommitError: 500,
    ModelLoadError: 500,
    RepositoryPollError: 500,
    MemoryBudgetError: 500,
    InternalError: 500,
    UnsupportedError: 501,
    TlsError: 500,
    AgentError: 500,
    ModelNotReadyError: 503,
    ModelControlDisabledError: 503,
    OverloadedError: 503,
    StoppingError: 503,
    RequestTimeoutError: 503,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_for(error: BaseException) -> int:
    """The HTTP status for an error (any non-`AgentError` is an `InternalError`: 500)."""
    return lookup(STATUS_FOR_ERROR, error)


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def error_answer(
    dataplane: DataPlane, error: BaseException, where: str = "POST /infer"
) -> tuple[int, str, bool]:
    """The answer to an error from a request (`where`: its method and path, for the log): the
    status, the message with no path of the device, and whether the connection must close (the
    rest of the body is never read). Anything but an `AgentError` is a bug: logged with its
    traceback and answered 500. `request_middleware` and the infer lane both answer with it."""
    if not isinstance(error, AgentError):
        logger.error("%s failed", where, exc_info=error)
    message = dataplane.scrub(InternalError.wrap(error).message)
    return status_for(error), message, must_close(error)


def request_middleware(
    max_request_bytes: int,
    body_timeout_s: float,
    access: ApiAccess | None,
    status_token: Callable[[], str | None] | None,
) -> Middleware:
    """What every request goes through before its handler, in this order, as one layer (each
    middleware layer costs a coroutine per request on the event loop):

    1. the status page's token (`status_token` gives the token in force, None: open), answered
       401 before anything else is read;
    2. restricted API groups (`access`): refused without their header, before the body is read;
    3. the body, read up front within its size limit and timeout (`agent.api.http.limits`);
    4. errors, from any of these or the handler: agent errors and aiohttp's own HTTP errors
       become Triton-style JSON errors; an unexpected exception is logged with its traceback
       and answered as a JSON 500.
    """
    guarded = frozenset(STATUS_PATHS)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if status_token is not None or access is not None:
                resource = request.match_info.route.resource  # None: 404/405, from aiohttp
                on_status_page = resource is not None and resource.canonical in guarded
                if status_token is not None and on_status_page:
                    token = status_token()
                    if token is not None and not token_matches(request_token(request), token):
                        return unauthorized()
                restrictions = access.http if access is not None else None  # a reload swaps it
                if restrictions and resource is not None:
                    endpoint = http_endpoint(request.method, resource.canonical)
                    refusal = restrictions.refusal(endpoint, request.headers)  # case-insensitive
                    if refusal is not None:
                        raise RestrictedApiError(refusal)
            if request.body_exists:
                await read_body_up_front(request, max_request_bytes, body_timeout_s)
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            message = f"request body over the limit of {max_request_bytes} bytes"
            answer = error_response(413, message)
            answer.force_close()
            return answer
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason)
        except Exception as exc:  # noqa: BLE001 - by the table; a bug logged by error_answer
            where = f"{request.method} {request.path}"
            status, message, close = error_answer(request.app[DATAPLANE], exc, where)
            answer = error_response(status, message)
            if close:
                answer.force_close()
            return answer

    return middleware


def create_app(
    dataplane: DataPlane,
    *,
    max_request_bytes: int,
    max_bytes_elements: int = DEFAULT_MAX_BYTES_ELEMENTS,
    body_timeout_s: float = 60.0,
    access: ApiAccess | None = None,
    status: StatusSource | None = None,
    status_token: Callable[[], str | None] | None = None,
    infer_lane: bool = True,
) -> web.Application:
    """Build the HTTP application around a data plane (limits: `agent.api.http.limits`;
    restricted API groups: `agent.api.access`; the status page: `agent.api.status_page`, with
    `status_token` giving the token it needs, None: open; `infer_lane`: serve `/infer` in
    its commonest shape straight from the connection, `agent.api.http.lane`)."""
    middlewares = [request_middleware(max_request_bytes, body_timeout_s, access, status_token)]
    app = web.Application(
        middlewares=middlewares,
        client_max_size=max_request_bytes,
    )
    app[DATAPLANE] = dataplane
    app[STOPPING] = asyncio.Event()
    app[TENSOR_LIMITS] = TensorLimits(max_request_bytes, max_bytes_elements)
    app[STATUS_SOURCE] = status if status is not None else BasicStatus(dataplane)
    if infer_lane:
        app[INFER_LANE] = InferLane(
            dataplane,
            app[TENSOR_LIMITS],
            max_request_bytes,
            access,
            lambda exc: error_answer(dataplane, exc),
        )
    model = "/v2/models/{model}"
    version = "/v2/models/{model}/versions/{version}"
    repo = "/v2/repository/models/{model}"
    system, cuda = "/v2/systemsharedmemory", "/v2/cudasharedmemory"
    app.add_routes(
        [
            # Inference first: the router tries routes in order, and this is the hot path.
            web.post(model + "/infer", _infer),
            web.post(version + "/infer", _infer),
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
# ready for a model): KServe's SDK reads them; Triton's clients read only the status.
async def _live(request: web.Request) -> web.Response:
    ok = dataplane_of(request).server_live()
    return json_status({"live": ok}, 200 if ok else 503)


async def _ready(request: web.Request) -> web.Response:
    ok = dataplane_of(request).server_ready()
    return json_status({"ready": ok}, 200 if ok else 503)


async def _server_metadata(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).server_metadata())


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_bytes(), content_type="application/json")


async def _model_metadata(request: web.Request) -> web.Response:
    return json_answer(dataplane_of(request).model_metadata(*target(request)))


async def _model_ready(request: web.Request) -> web.Response:
    ok = dataplane_of(request).model_ready(*target(request))
    return json_status({"name": request.match_info["model"], "ready": ok}, 200 if ok else 503)


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


async def _infer(request: web.Request) -> web.Response:
    """The aiohttp route of `/infer`: a connection the infer lane handed over (see
    `agent.api.http.lane`), or a listener without the lane."""
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
    return _infer_response(payload, json_length)


def _infer_response(payload: bytes, json_length: int | None) -> web.Response:
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
