"""The limits of the HTTP (and gRPC) listeners, and the errors a client meets at them.

`ConnectionLimits` holds the `[server]` connection cap and timeouts every listener shares (the
connection guard, `agent.api.http.connection`, and the gRPC engines enforce them). The errors:

* `ClientTimeoutError` (408): a body that did not arrive within `server.body_timeout_ms`;
* `StoppingError` (503): the agent began to stop while a body was still arriving;
* `agent.errors.PayloadTooLargeError` (413): a body over `server.max_request_bytes`;
* `agent.errors.MemoryPressureError` (503): a body that does not fit in the memory budget's pool
  for requests in flight.

After any of them the rest of the body is never read, so the answer closes the connection
(`must_close`). Which request meets which limit is the HTTP policy's decision
(`agent.api.http.policy`); this module only names them and reads a body as sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from agent.errors import (
    AgentError,
    InvalidInputError,
    MemoryPressureError,
    OverloadedError,
    PayloadTooLargeError,
)

__all__ = [
    "ClientTimeoutError",
    "ConnectionLimits",
    "StoppingError",
    "must_close",
    "read_body",
]


class ClientTimeoutError(AgentError):
    """The client sent its request body too slowly (HTTP 408)."""


class StoppingError(OverloadedError):
    """The agent began to stop while a request's body was still arriving (HTTP 503)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections may be open and how long a client may take (`[server]` settings)."""

    max_connections: int = 2048
    header_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    body_timeout_s: float = 60.0
    # gRPC: a connection backed up over its cap (agent.api.grpc.sending) whose peer takes no
    # byte for this long is closed.
    send_timeout_s: float = 30.0


async def read_body(request: web.Request) -> bytes:
    """The request body; one that cannot be read as sent (a bad gzip or deflate stream, a body
    cut short) is the client's error, not the agent's.

    Raises:
        InvalidInputError: aiohttp could not read or decode the body.
    """
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        reason = " ".join(str(exc).split()).removeprefix("400, message: ")
        raise InvalidInputError(f"could not read the request body: {reason}") from None


def must_close(error: BaseException) -> bool:
    """Whether an answer to this error must close the connection: the body was not read whole."""
    return isinstance(
        error, PayloadTooLargeError | ClientTimeoutError | StoppingError | MemoryPressureError
    )
