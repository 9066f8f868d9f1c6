"""The HTTP policy: every rule a request meets before its handler, decided in one place for both
front doors.

A request reaches the agent through one of two doors: the infer lane (`agent.api.http.lane`),
which answers `/infer` in its commonest shape straight from the connection, or aiohttp's handler
behind the one middleware (`agent.api.http.middleware`). Both ask the same `HttpPolicy` (one per
app, `HTTP_POLICY`) and answer its refusals through the one error table
(`agent.api.http.errors`), so the status and the bytes are the same whichever door a request
came through. The rules, in this order:

1. the status page's token, on the status routes only: 401 before anything else is read;
2. restricted API groups (`agent.api.access`): 403 without the group's header, before the body;
3. the declared body length: over `max_request_bytes`, 413 before a byte of the body is read;
4. memory in flight (`agent.models.inflight`): the declared body, times its decode factor, must
   fit in the memory budget's pool for requests in flight, else 503 before a byte of the body
   is read; the hold lasts until the answer is handed to the socket (`hold_body`);
5. a body still arriving: it must arrive within `body_timeout_s` (else 408), and once the agent
   begins to stop (`begin_stop`), it is answered 503 at once: aiohttp drops what a connection
   sends after its server began to stop, so such a body could never complete.

After 3, 4 and 5 the rest of the body is never read, so the answer closes the connection. A door
may skip work, never a rule: the lane asks `refusal` and `stopping` for every request, answers a
403 itself, and hands a request whose body will never be read (3 to 5) to aiohttp's door, whose
middleware asks the same questions and reads the rest away before it closes; the lane serves no
status route. A reload swaps the restrictions inside `ApiAccess` (one reference), read per
request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent.api.access import ApiAccess, Headers, RestrictedApiError, http_endpoint
from agent.api.http.limits import ClientTimeoutError, StoppingError, read_body
from agent.api.status_page import STATUS_PATHS
from agent.errors import AgentError, PayloadTooLargeError
from agent.models.inflight import Hold, InflightBytes, body_cost
from agent.pages import request_token, token_matches

__all__ = ["HTTP_POLICY", "HttpPolicy"]


class HttpPolicy:
    """Access, the status token, body limits and stopping for one HTTP app (see the module doc).

    Args:
        max_request_bytes: the largest body (`server.max_request_bytes`).
        body_timeout_s: how long a body may take once its headers are in.
        access: the restricted API groups (None: the agent started without any, and nothing is
            checked per request; a reload cannot add the first one).
        status_token: the status page's token in force, read per request (None: open).
        inflight: the memory budget's pool for requests in flight (None: not counted).
    """

    __slots__ = (
        "_access",
        "_guarded",
        "_inflight",
        "_stopping",
        "_token",
        "body_timeout_s",
        "max_request_bytes",
    )

    def __init__(
        self,
        *,
        max_request_bytes: int,
        body_timeout_s: float,
        access: ApiAccess | None = None,
        status_token: Callable[[], str | None] | None = None,
        inflight: InflightBytes | None = None,
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self._inflight = inflight
        self.body_timeout_s = body_timeout_s
        self._access = access
        self._token = status_token
        self._guarded = frozenset(STATUS_PATHS)
        self._stopping = asyncio.Event()  # binds to the loop that first waits on it

    @property
    def stopping(self) -> bool:
        """Whether the agent began to stop (rule 4 refuses bodies still arriving)."""
        return self._stopping.is_set()

    def begin_stop(self) -> None:
        """The listener stops: bodies still arriving, now or later, are answered 503 at once."""
        self._stopping.set()

    def token_refused(self, route: str | None, request: web.Request) -> bool:
        """Rule 1: whether a request to `route` (its canonical path; None: no route matched)
        lacks the status page's token and must be answered 401 (`agent.pages.unauthorized`)."""
        if self._token is None or route not in self._guarded:
            return False
        token = self._token()
        return token is not None and not token_matches(request_token(request), token)

    def refusal(
        self,
        method: str,
        route: str | None,
        headers: Headers,
        declared_length: int | None,
    ) -> AgentError | None:
        """Rules 2 and 3: why a request is refused before its body is read, or None.

        Args:
            method: the request's method (HEAD is judged as GET).
            route: its canonical route (`/v2/models/{model}/infer`); None: no route matched
                (aiohttp answers 404 or 405), so no group applies.
            headers: its headers, case-insensitive (aiohttp's) or by lower-case name (the
                lane's head); read only when a group is restricted.
            declared_length: its Content-Length, None when not declared.

        Returns:
            `RestrictedApiError` (403) or `PayloadTooLargeError` (413, the connection closes);
            None: admitted.
        """
        access = self._access
        if access is not None and route is not None:
            restrictions = access.http  # one reference: a reload swaps it
            if restrictions:
                why = restrictions.refusal(http_endpoint(method, route), headers)
                if why is not None:
                    return RestrictedApiError(why)
        if declared_length is not None and declared_length > self.max_request_bytes:
            return self.body_too_large(declared_length)
        return None

    def hold_body(self, length: int | None, *, binary: bool) -> Hold | None:
        """Rule 4: hold a body's bytes in flight before it is read (None: nothing to hold).

        Args:
            length: the body's length (declared, or as read when it was not declared).
            binary: whether it carries binary tensors (`Inference-Header-Content-Length`): a JSON
                body costs more to decode (`agent.models.inflight.body_cost`).

        Raises:
            MemoryPressureError: the body does not fit in the pool now (503, the connection
                closes: the body is never read).
        """
        if self._inflight is None or not length:
            return None
        kind = "a binary body" if binary else "a JSON body"
        return self._inflight.hold(
            body_cost(length, binary=binary), f"{kind} of {length / (1 << 20):.1f} MiB"
        )

    def body_too_large(self, declared_length: int | None) -> PayloadTooLargeError:
        """Rule 3's error, for a declared length or for a body found too long while read."""
        if declared_length is None:
            return PayloadTooLargeError(
                f"request body over the limit of {self.max_request_bytes} bytes"
            )
        return PayloadTooLargeError(
            f"request body of {declared_length} bytes is over the limit of "
            f"{self.max_request_bytes} bytes (server.max_request_bytes)"
        )

    def stopped_body(self) -> StoppingError | None:
        """Rule 4 at the stop: the error for a request whose body is still arriving (None: the
        agent is not stopping, the body may go on arriving)."""
        if not self._stopping.is_set():
            return None
        return StoppingError("the server is stopping: the request body did not arrive before")

    async def read_body(self, request: web.Request) -> None:
        """Rule 4 on aiohttp's door: read a request's body before its handler runs, within the
        body timeout and the stop; aiohttp keeps it, so the handler's `read()` returns it.

        Raises:
            ClientTimeoutError: the body did not arrive in time.
            StoppingError: the agent began to stop before the body arrived.
            InvalidInputError: the body cannot be read as sent (`limits.read_body`).
        """
        if request.content.is_eof():  # all arrived with the headers: no timer needed
            await read_body(request)
            return
        stopped = self.stopped_body()
        if stopped is not None:
            raise stopped
        started = time.monotonic()
        waiting: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._stopping.wait())}
        reading = asyncio.ensure_future(read_body(request))
        try:
            await asyncio.wait(
                {reading, *waiting},
                timeout=self.body_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in waiting:
                task.cancel()
            if not reading.done():
                reading.cancel()
        if reading.done() and not reading.cancelled():
            reading.result()  # its error, if any
            return
        stopped = self.stopped_body()
        if stopped is not None:
            raise stopped
        raise ClientTimeoutError(
            f"request body not received within {time.monotonic() - started:.1f} s "
            f"(server.body_timeout_ms)"
        )


# The app's policy: the lane and the middleware hold this same object.
HTTP_POLICY = web.AppKey("http_policy", HttpPolicy)
