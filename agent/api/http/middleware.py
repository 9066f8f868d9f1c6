"""aiohttp's door: the one middleware every request of the KServe app goes through before its
handler (the other door, the infer lane, asks the same policy: `agent.api.http.lane`).

One layer, since each middleware layer costs a coroutine per request on the event loop. In order:

1. the request is marked as running on its connection (`agent.api.http.connection`), so the
   guard's clock never closes it mid-request;
2. the policy's rules (`agent.api.http.policy`): the status token (401), restricted API groups
   (403), the declared body length (413), the body's memory in flight (503, held until the
   handler returns), then the body read up front within its timeout (408) and the stop (503);
3. the handler;
4. errors, from any of these or the handler, through the one error table
   (`agent.api.http.errors`): agent errors and aiohttp's own HTTP errors become Triton-style
   JSON errors; an unexpected exception is logged with its traceback and answered as a JSON 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.api.http.codec import HEADER_LENGTH
from agent.api.http.connection import running_on
from agent.api.http.context import DATAPLANE
from agent.api.http.errors import error_answer, error_response
from agent.api.http.policy import HttpPolicy
from agent.models.inflight import Hold
from agent.pages import unauthorized

__all__ = ["request_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_middleware(policy: HttpPolicy) -> Middleware:
    """The middleware applying `policy` (the app's `HTTP_POLICY`: the lane holds the same)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        tracked = running_on(request)
        if tracked is not None:
            tracked.request_started()
        hold: Hold | None = None
        try:
            resource = request.match_info.route.resource  # None: 404/405, from aiohttp
            route = resource.canonical if resource is not None else None
            if policy.token_refused(route, request):
                return unauthorized()
            refusal = policy.refusal(request.method, route, request.headers, request.content_length)
            if refusal is not None:
                raise refusal
            if request.body_exists:
                binary = HEADER_LENGTH in request.headers
                hold = policy.hold_body(request.content_length, binary=binary)
                await policy.read_body(request)
                if hold is None:  # no declared length: held as read
                    hold = policy.hold_body(len(await request.read()), binary=binary)
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:  # a body without a declared length, found too long
            return _answer(request, policy.body_too_large(None))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason)
        except Exception as exc:  # noqa: BLE001 - by the table; a bug logged by error_answer
            return _answer(request, exc)
        finally:
            if hold is not None:
                hold.release()
            if tracked is not None:
                tracked.request_finished()

    return middleware


def _answer(request: web.Request, error: Exception) -> web.Response:
    where = f"{request.method} {request.path}"
    status, message, close = error_answer(request.app[DATAPLANE], error, where)
    answer = error_response(status, message)
    if close:
        answer.force_close()
    return answer
