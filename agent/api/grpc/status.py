"""gRPC status codes, the one place they are spelled (pure: no grpcio, no I/O).

`Status` is gRPC's code list (grpc/doc/statuscodes.md) as an IntEnum: its value is what goes in
the `grpc-status` trailer. The servicer (`service`) and the loop engine speak `Status` only; the
grpc.aio engine turns it into `grpc.StatusCode` at its edge (`aio.grpcio_code`). `StatusError`
is how a call ends with a status: the servicer raises it, each engine writes it its own way.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["DESERIALIZE_FAILED", "Status", "StatusError"]


class Status(enum.IntEnum):
    """gRPC's status codes, by their wire values."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# grpcio's words for a request message that does not parse (clients match on them).
DESERIALIZE_FAILED: Final = "Exception deserializing request!"


class StatusError(Exception):
    """The call ends with `status` and `message` (the `grpc-message` trailer)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
