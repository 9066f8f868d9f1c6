"""Bytes in flight: the share of the memory budget kept for requests while the agent holds them.

The memory budget covers two things: what each loaded model version's plan reserved
(`agent.models.memory_plan.MemoryLedger`) and the requests in flight: bodies being read, the
tensors decoded from them, the outputs and the response bytes not yet handed to the socket. The
second is this pool. It is reserved in the ledger at start-up (`MemoryLedger.keep_for_inflight`),
so model plans can never take it, and every transport asks it before it takes a request's bytes:

* HTTP, both doors (`agent.api.http.policy`): the declared body length times its decode factor,
  before a byte of the body is read; the encoded response is added to the hold once made;
* gRPC, both engines (`agent.api.grpc.service`): the message times its decode factor once the
  message is complete (HTTP/2 frames arrive before the length is known), the response likewise.

A request that does not fit is refused at once with `MemoryPressureError` (HTTP 503, gRPC
RESOURCE_EXHAUSTED, naming the figures); nothing waits, so a burst cannot pile up memory in
waiters either. A hold that grows after the fact (a response already made) is counted even past
the pool: the next request is refused until it is released, so the pool overshoots by at most
one response per request already admitted.

Pure: no clock, no I/O, no lock. Every caller runs on the agent's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import MemoryPressureError

__all__ = [
    "BINARY_FACTOR",
    "JSON_FACTOR",
    "Hold",
    "InflightBytes",
    "InflightFigures",
    "body_cost",
    "default_capacity",
]

MIB = 1 << 20

# A JSON body is decoded at most ~3x its size (`agent.api.http.codec`); a binary one keeps its
# tensors as views of the body, plus one copy when a batch is gathered.
JSON_FACTOR = 3
BINARY_FACTOR = 2


def body_cost(length: int, *, binary: bool) -> int:
    """The bytes a request body of `length` bytes may take while it is decoded and served."""
    return length * (BINARY_FACTOR if binary else JSON_FACTOR)


@dataclass(frozen=True, slots=True)
class InflightFigures:
    """A snapshot of the pool, as metrics, `/v2/status` and telemetry show it."""

    capacity_bytes: int
    held_bytes: int
    peak_bytes: int
    holds: int
    refused: int

    def to_json(self) -> dict[str, int]:
        return {
            "inflight_capacity_bytes": self.capacity_bytes,
            "inflight_bytes": self.held_bytes,
            "inflight_peak_bytes": self.peak_bytes,
            "inflight_requests": self.holds,
            "inflight_refused": self.refused,
        }


class Hold:
    """One request's bytes in the pool; `release` gives them back (once, whatever the path)."""

    __slots__ = ("_pool", "nbytes")

    def __init__(self, pool: InflightBytes, nbytes: int) -> None:
        self._pool: InflightBytes | None = pool
        self.nbytes = nbytes

    def grow(self, nbytes: int) -> None:
        """Count `nbytes` more that already exist (a response made): never refused."""
        if self._pool is not None and nbytes > 0:
            self.nbytes += nbytes
            self._pool._add(nbytes)

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._release(self.nbytes)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class InflightBytes:
    """The pool for requests in flight (see the module doc). Event-loop only."""

    def __init__(self, capacity_bytes: int) -> None:
        """A pool of `capacity_bytes` (>= 0, else ValueError)."""
        if capacity_bytes < 0:
            raise ValueError(f"in-flight capacity must be >= 0, got {capacity_bytes}")
        self._capacity = capacity_bytes
        self._held = 0
        self._peak = 0
        self._holds = 0
        self._refused = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def held_bytes(self) -> int:
        return self._held

    def hold(self, nbytes: int, what: str) -> Hold:
        """Hold `nbytes` for one request, or refuse it.

        Args:
            nbytes: what the request may take (>= 0; 0 holds nothing and is never refused).
            what: the request in a few words, for the error ("a JSON body of 57.0 MiB").

        Raises:
            MemoryPressureError: the bytes do not fit in what the pool has left.
        """
        if nbytes > 0 and self._held + nbytes > self._capacity:
            self._refused += 1
            if nbytes > self._capacity:
                why = f"more than the whole in-flight memory of {_mib(self._capacity)}"
            else:
                why = (
                    f"{_mib(self._capacity - self._held)} of the {_mib(self._capacity)} "
                    f"in-flight memory is free now; retry later"
                )
            raise MemoryPressureError(
                f"memory budget: {what} needs {_mib(nbytes)} while served, {why} "
                f"(models.inflight_memory_bytes)"
            )
        self._add(max(nbytes, 0))
        self._holds += 1
        return Hold(self, max(nbytes, 0))

    def figures(self) -> InflightFigures:
        return InflightFigures(self._capacity, self._held, self._peak, self._holds, self._refused)

    def reset_peak(self) -> None:
        """Start the peak over from what is held now (a bench's phases)."""
        self._peak = self._held

    def _add(self, nbytes: int) -> None:
        self._held += nbytes
        self._peak = max(self._peak, self._held)

    def _release(self, nbytes: int) -> None:
        self._held -= nbytes
        self._holds -= 1


def default_capacity(budget_bytes: int, left_bytes: int) -> int:
    """The pool when `models.inflight_memory_bytes` is 0: a quarter of the budget, at most
    1 GiB and at least 64 MiB, never more than what the agent's own base left."""
    wanted = min(max(budget_bytes // 4, 64 * MIB), 1 << 30)
    return max(0, min(wanted, left_bytes))


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB"
