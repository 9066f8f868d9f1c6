"""KServe v2 HTTP/REST endpoints on aiohttp, plus Triton's repository index.

Handlers are thin: parse with `agent.api.http_codec`, call `agent.serving.dataplane`, serialize.
One middleware maps every error to a status code (`STATUS_FOR_ERROR`, read through
`agent.errors.lookup`) and Triton's `{"error": "..."}` body; an unexpected exception is logged
with its traceback and answered as a JSON 500, never as aiohttp's plain-text page.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.api.access import (
    ApiAccess,
    RestrictedApiError,
    http_endpoint,
    require_local_registrant,
)
from agent.api.http_codec import HEADER_LENGTH, decode_infer_request, encode_infer_response
from agent.api.http_generate import REFUSAL, generate_routes
from agent.api.http_limits import ClientTimeoutError, body_middleware, must_close, read_body
from agent.api.model_load import ModelLoadFailedError, invalid_override, load_model
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
from agent.models.pushed import FILE_PREFIX
from agent.pages import token_middleware
from agent.serving.cuda_regions import register_request_from_json
from agent.serving.dataplane import DataPlane
from agent.tensors.limits import DEFAULT_MAX_BYTES_ELEMENTS, TensorLimits

logger = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)
TENSOR_LIMITS = web.AppKey("tensor_limits", TensorLimits)


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
    RequestTimeoutError: 503,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_for(error: BaseException) -> int:
    """The HTTP status for an error (any non-`AgentError` is an `InternalError`: 500)."""
    return lookup(STATUS_FOR_ERROR, error)


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def error_middleware(max_request_bytes: int) -> Middleware:
    """Turn agent errors and aiohttp's own HTTP errors into Triton-style JSON errors."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except AgentError as exc:
            # no path of the device in what the client reads
            answer = error_response(status_for(exc), request.app[DATAPLANE].scrub(exc.message))
            if must_close(exc):  # the rest of the body is never read
                answer.force_close()
            return answer
        except web.HTTPRequestEntityTooLarge:
            message = f"request body over the limit of {max_request_bytes} bytes"
            answer = error_response(413, message)
            answer.force_close()
            return answer
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason)
        except Exception as exc:  # a bug: answered in JSON, logged with its traceback
            logger.exception("%s %s failed", request.method, request.path)
            message = request.app[DATAPLANE].scrub(InternalError.wrap(exc).message)
            return error_response(status_for(exc), message)

    return middleware


def restriction_middleware(access: ApiAccess) -> Middleware:
    """Refuse requests to a restricted API group without its header (before the body is read)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        restrictions = access.http  # read once: a reload swaps it
        resource = request.match_info.route.resource
        if restrictions and resource is not None:  # None: 404/405, answered by aiohttp
            endpoint = http_endpoint(request.method, resource.canonical)
            refusal = restrictions.refusal(endpoint, request.headers)  # case-insensitive
            if refusal is not None:
                raise RestrictedApiError(refusal)
        return await handler(request)

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
) -> web.Application:
    """Build the HTTP application around a data plane (limits: `agent.api.http_limits`;
    restricted API groups: `agent.api.access`; the status page: `agent.api.status_page`, with
    `status_token` giving the token it needs, None: open)."""
    middlewares = [error_middleware(max_request_bytes)]
    if status_token is not None:
        middlewares.append(token_middleware(status_token, STATUS_PATHS))
    if access is not None:
        middlewares.append(restriction_middleware(access))
    middlewares.append(body_middleware(max_request_bytes, body_timeout_s))
    app = web.Application(
        middlewares=middlewares,
        client_max_size=max_request_bytes,
    )
    app[DATAPLANE] = dataplane
    app[TENSOR_LIMITS] = TensorLimits(max_request_bytes, max_bytes_elements)
    app[STATUS_SOURCE] = status if status is not None else BasicStatus(dataplane)
    model = "/v2/models/{model}"
    version = "/v2/models/{model}/versions/{version}"
    app.add_routes(
        [
            # Inference first: the router tries routes in order, and this is the hot path.
            web.post(model + "/infer", _infer),
            web.post(version + "/infer", _infer),
            # Triton's generate extension: generate, generate_stream (agent.api.http_generate).
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
            web.post("/v2/repository/index", _repository_index),
            web.post("/v2/repository/models/{model}/load", _load_model),
            web.post("/v2/repository/models/{model}/unload", _unload_model),
            web.get("/v2/repository/models/{model}/versions", _cached_versions),
            web.post("/v2/repository/models/{model}/versions/{version}/activate", _activate),
            web.post("/v2/repository/models/{model}/rollback", _rollback),
            web.post("/v2/repository/models/{model}/clear-rejected", _clear_rejected),
            web.get("/v2/trace/setting", _trace_setting),
            web.post("/v2/trace/setting", _trace_setting),
            web.get(model + "/trace/setting", _trace_setting),
            web.post(model + "/trace/setting", _trace_setting),
            web.get("/v2/logging", _log_settings),
            web.post("/v2/logging", _update_log_settings),
            web.get("/v2/systemsharedmemory/status", _shm_status),
            web.get("/v2/systemsharedmemory/region/{region}/status", _shm_status),
            web.post("/v2/systemsharedmemory/region/{region}/register", _shm_register),
            web.post("/v2/systemsharedmemory/unregister", _shm_unregister),
            web.post("/v2/systemsharedmemory/region/{region}/unregister", _shm_unregister),
            # CUDA shared memory, as Triton without GPU support answers it (issue 26)
            web.get("/v2/cudasharedmemory/status", _cuda_shm_status),
            web.get("/v2/cudasharedmemory/region/{region}/status", _cuda_shm_status),
            web.post("/v2/cudasharedmemory/region/{region}/register", _cuda_shm_register),
            web.post("/v2/cudasharedmemory/unregister", _cuda_shm_unregister),
            web.post("/v2/cudasharedmemory/region/{region}/unregister", _cuda_shm_unregister),
            *status_routes(),
        ]
    )
    return app


def _dataplane(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def _target(request: web.Request) -> tuple[str, str | None]:
    return request.match_info["model"], request.match_info.get("version")


def _json(body: Any) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")), content_type="application/json"
    )


# Health bodies are the Open Inference Protocol's ({"live": true}, {"ready": true}, and name and
# ready for a model): KServe's SDK reads them; Triton's clients read only the status.
async def _live(request: web.Request) -> web.Response:
    ok = _dataplane(request).server_live()
    return _json_status({"live": ok}, 200 if ok else 503)


async def _ready(request: web.Request) -> web.Response:
    ok = _dataplane(request).server_ready()
    return _json_status({"ready": ok}, 200 if ok else 503)


def _json_status(body: dict[str, Any], status: int) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )


async def _server_metadata(request: web.Request) -> web.Response:
    return _json(_dataplane(request).server_metadata())


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_bytes(), content_type="application/json")


async def _model_metadata(request: web.Request) -> web.Response:
    return _json(_dataplane(request).model_metadata(*_target(request)))


async def _model_ready(request: web.Request) -> web.Response:
    ok = _dataplane(request).model_ready(*_target(request))
    return _json_status({"name": request.match_info["model"], "ready": ok}, 200 if ok else 503)


async def _model_config(request: web.Request) -> web.Response:
    return _json(_dataplane(request).model_config(*_target(request)))


async def _statistics(request: web.Request) -> web.Response:
    name = request.match_info.get("model")
    return _json(_dataplane(request).statistics(name, request.match_info.get("version")))


async def _canary_start(request: web.Request) -> web.Response:
    """Body: {"version": N, "share": 0.1, ...} (see `agent.canary.policy.parse_policy`)."""
    policy = policy_from_request(await _optional_json(request))
    return _json(_dataplane(request).canary.start(request.match_info["model"], policy))


async def _canary_status(request: web.Request) -> web.Response:
    return _json(_dataplane(request).canary.status(request.match_info["model"]))


async def _canary_stop(request: web.Request) -> web.Response:
    return _json(_dataplane(request).canary.stop(request.match_info["model"]))


async def _repository_index(request: web.Request) -> web.Response:
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
    return _json(_dataplane(request).repository_index(ready_only))


async def _load_model(request: web.Request) -> web.Response:
    """Triton's load: an optional body {"parameters": {"config": "<model config JSON>",
    "file:<path>": "<base64>"...}}."""
    doc = await _optional_json(request)
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
    await load_model(_dataplane(request), request.match_info["model"], config, files)
    # --- end load with files ---
    return web.Response(status=200)


async def _unload_model(request: web.Request) -> web.Response:
    await _optional_json(request)
    await _dataplane(request).unload_model(request.match_info["model"])
    return web.Response(status=200)


async def _cached_versions(request: web.Request) -> web.Response:
    return _json(_dataplane(request).cached_versions(request.match_info["model"]))


async def _activate(request: web.Request) -> web.Response:
    await _optional_json(request)
    version = _version_number(request.match_info["version"])
    strategy = await _dataplane(request).activate_version(request.match_info["model"], version)
    return _json({"model": request.match_info["model"], "version": version, "strategy": strategy})


async def _rollback(request: web.Request) -> web.Response:
    """Body {"version": N} picks the version; without it, the one served before."""
    doc = await _optional_json(request)
    raw = doc.get("version")
    version = None if raw is None else _version_number(str(raw))
    done = await _dataplane(request).rollback(request.match_info["model"], version)
    return _json({"model": request.match_info["model"], "version": done})


async def _clear_rejected(request: web.Request) -> web.Response:
    """Body {"version": N} lifts one version's rejection; without it, all of the model's."""
    doc = await _optional_json(request)
    raw = doc.get("version")
    version = None if raw is None else _version_number(str(raw))
    model = request.match_info["model"]
    cleared = await _dataplane(request).clear_rejected(model, version, by="clear-rejected")
    return _json({"model": model, "cleared": cleared})


async def _trace_setting(request: web.Request) -> web.Response:
    """Triton's trace extension; POST body: the settings to change, e.g. {"trace_rate": "1"}."""
    changes = await _optional_json(request) if request.method == "POST" else None
    return _json(_dataplane(request).trace_setting(request.match_info.get("model"), changes))


async def _log_settings(request: web.Request) -> web.Response:
    return _json(_dataplane(request).log_settings.get())


async def _update_log_settings(request: web.Request) -> web.Response:
    """Body: the settings to change, e.g. {"log_verbose_level": 1} (Triton's logging extension)."""
    changes = await _optional_json(request)
    return _json(_dataplane(request).log_settings.update(changes))


async def _shm_status(request: web.Request) -> web.Response:
    regions = _dataplane(request).shared_memory.status(request.match_info.get("region"))
    return _json([r.to_json() for r in regions])


async def _shm_register(request: web.Request) -> web.Response:
    """Body: {"key": "/name", "offset": 0, "byte_size": N} (Triton's register request)."""
    doc = await _optional_json(request)
    key, offset, byte_size = doc.get("key"), doc.get("offset", 0), doc.get("byte_size")
    if not isinstance(key, str) or not isinstance(offset, int) or not isinstance(byte_size, int):
        raise InvalidInputError(
            'register request body must be {"key": string, "offset": integer, "byte_size": integer}'
        )
    require_local_registrant(request.remote)
    _dataplane(request).shared_memory.register(request.match_info["region"], key, offset, byte_size)
    return web.Response(status=200)


async def _shm_unregister(request: web.Request) -> web.Response:
    regions = _dataplane(request).shared_memory
    name = request.match_info.get("region")
    if name is None:
        regions.unregister_all()
    else:
        regions.unregister(name)
    return web.Response(status=200)


async def _cuda_shm_status(request: web.Request) -> web.Response:
    regions = _dataplane(request).cuda_shared_memory.status(request.match_info.get("region"))
    return _json([r.to_json() for r in regions])


async def _cuda_shm_register(request: web.Request) -> web.Response:
    """Body: {"raw_handle": {"b64": BASE64}, "device_id": 0, "byte_size": N} (tritonclient's)."""
    raw_handle, device_id, byte_size = register_request_from_json(await _optional_json(request))
    require_local_registrant(request.remote)
    _dataplane(request).cuda_shared_memory.register(
        request.match_info["region"], raw_handle, device_id, byte_size
    )
    return web.Response(status=200)


async def _cuda_shm_unregister(request: web.Request) -> web.Response:
    _dataplane(request).cuda_shared_memory.unregister(request.match_info.get("region"))
    return web.Response(status=200)


def _version_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # not "²" (a digit)
        raise InvalidInputError(f"version must be a positive integer, got {text!r}")
    return int(text)


async def _optional_json(request: web.Request) -> dict[str, Any]:
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


async def _infer(request: web.Request) -> web.Response:
    if _dataplane(request).tracer.active:
        return await _infer_traced(request)
    header_length = _header_length(request)
    body = await read_body(request)
    infer_request = decode_infer_request(body, header_length, limits=request.app[TENSOR_LIMITS])
    response = await _dataplane(request).infer(*_target(request), infer_request, refusal=REFUSAL)
    return _infer_response(*encode_infer_response(response, infer_request))


async def _infer_traced(request: web.Request) -> web.Response:
    """`_infer` with Triton's HTTP timestamps when the request is sampled for tracing."""
    dataplane = _dataplane(request)
    received = time.perf_counter_ns()
    header_length = _header_length(request)
    body = await read_body(request)
    infer_request = decode_infer_request(body, header_length, limits=request.app[TENSOR_LIMITS])
    trace = dataplane.tracer.start(request.match_info["model"], infer_request.id or "")
    if trace is None:
        response = await dataplane.infer(*_target(request), infer_request, refusal=REFUSAL)
        return _infer_response(*encode_infer_response(response, infer_request))
    trace.stamp("HTTP_RECV_START", received)
    trace.stamp("HTTP_RECV_END")
    trace.propagate(request.headers)
    try:
        response = await dataplane.infer(*_target(request), infer_request, trace, refusal=REFUSAL)
        trace.stamp("HTTP_SEND_START")
        answer = _infer_response(*encode_infer_response(response, infer_request))
        trace.stamp("HTTP_SEND_END")
        return answer
    finally:
        dataplane.tracer.finish(trace)


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
