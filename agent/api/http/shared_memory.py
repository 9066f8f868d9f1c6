"""Triton's system and CUDA shared-memory extensions over HTTP: region status, register and
unregister (CUDA answered as Triton without GPU support answers it where there is no CUDA)."""

from __future__ import annotations

from aiohttp import web

from agent.api.access import require_local_registrant
from agent.api.http.context import dataplane_of, json_answer, optional_json
from agent.errors import InvalidInputError
from agent.serving.cuda_regions import register_request_from_json


async def system_status(request: web.Request) -> web.Response:
    regions = dataplane_of(request).shared_memory.status(request.match_info.get("region"))
    return json_answer([r.to_json() for r in regions])


async def system_register(request: web.Request) -> web.Response:
    """Body: {"key": "/name", "offset": 0, "byte_size": N} (Triton's register request)."""
    doc = await optional_json(request)
    key, offset, byte_size = doc.get("key"), doc.get("offset", 0), doc.get("byte_size")
    if not isinstance(key, str) or not isinstance(offset, int) or not isinstance(byte_size, int):
        raise InvalidInputError(
            'register request body must be {"key": string, "offset": integer, "byte_size": integer}'
        )
    require_local_registrant(request.remote)
    dataplane_of(request).shared_memory.register(
        request.match_info["region"], key, offset, byte_size
    )
    return web.Response(status=200)


async def system_unregister(request: web.Request) -> web.Response:
    regions = dataplane_of(request).shared_memory
    name = request.match_info.get("region")
    if name is None:
        regions.unregister_all()
    else:
        regions.unregister(name)
    return web.Response(status=200)


async def cuda_status(request: web.Request) -> web.Response:
    regions = dataplane_of(request).cuda_shared_memory.status(request.match_info.get("region"))
    return json_answer([r.to_json() for r in regions])


async def cuda_register(request: web.Request) -> web.Response:
    """Body: {"raw_handle": {"b64": BASE64}, "device_id": 0, "byte_size": N} (tritonclient's)."""
    raw_handle, device_id, byte_size = register_request_from_json(await optional_json(request))
    require_local_registrant(request.remote)
    dataplane_of(request).cuda_shared_memory.register(
        request.match_info["region"], raw_handle, device_id, byte_size
    )
    return web.Response(status=200)


async def cuda_unregister(request: web.Request) -> web.Response:
    dataplane_of(request).cuda_shared_memory.unregister(request.match_info.get("region"))
    return web.Response(status=200)
