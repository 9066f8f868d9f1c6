"""Sequence batching as Triton's sequence batcher does it, with no clock, no asyncio and no I/O.

A stateful model sees the requests of one sequence (one correlation id) in order, one at a time,
each in a batch slot that the sequence holds from its START request to its END request (or until
it idles out). `SequenceBatcher` keeps the sequences and decides, for an instant `now` that the
caller passes in (seconds of `time.monotonic()`), which requests run together next.
`agent/scheduling/sequence_scheduler.py` drives it: `add()` on each arrival; on each wake-up
`expire(now)` (fail the refused requests, drop the state of the released sequences), then
`take(now)` until it returns None; `done()` once a batch has run; sleep until `deadline()`.

Invariants:

* A live sequence holds one slot; at most `slots` sequences are live. A START that finds every
  slot taken waits in the backlog (FIFO) with its later requests, until a slot frees or its
  deadline passes (the request's `timeout`, else `max_sequence_idle_us`): then it is refused.
* A batch holds at most one request per sequence, each the oldest queued one of its sequence, and
  a sequence with a request in a running batch has none in the next: its requests run in order.
* A live sequence with nothing queued or running for `max_sequence_idle_us` is released; a later
  request of it (without START) gets an error that says so.
* Strategy `direct` runs a batch once `minimum_slot_utilization` of the batch's slots have a
  request, or its oldest request has waited `max_queue_delay_us`. Strategy `oldest` batches like
  the dynamic batcher across its candidate sequences: at once on a preferred batch size (or a
  full batch), else after `max_queue_delay_us`.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from agent.errors import InvalidInputError, ModelConfigError, OverloadedError
from agent.proto import model_config_pb2 as mc

T = TypeVar("T")
CorrelationId = int | str

_US = 1e-6  # seconds per microsecond
_IDLE_DEFAULT_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
_RETIRED_KEPT = 4096  # idled-out ids remembered, to tell a late request why it failed


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """A request's sequence parameters: its correlation id and START / END flags."""

    correlation_id: CorrelationId
    start: bool = False
    end: bool = False


def sequence_parameters(params: Mapping[str, Any]) -> SequenceRequest | None:
    """Read `sequence_id`, `sequence_start`, `sequence_end` as tritonclient sends them.

    Returns:
        The sequence parameters, or None when the request has no correlation id (0 or "" count
        as none, as in Triton) and no flag.

    Raises:
        InvalidInputError: a parameter of the wrong type.
    """
    corrid = params.get("sequence_id")
    if corrid is not None and (
        isinstance(corrid, bool) or not isinstance(corrid, int | str) or _negative(corrid)
    ):
        raise InvalidInputError("parameter 'sequence_id' must be an unsigned integer or a string")
    flags = []
    for label in ("sequence_start", "sequence_end"):
        value = params.get(label, False)
        if not isinstance(value, bool):
            raise InvalidInputError(f"parameter '{label}' must be a boolean")
        flags.append(value)
    if corrid in (None, 0, "") and not any(flags):
        return None
    return SequenceRequest(0 if corrid is None else corrid, flags[0], flags[1])


def _negative(value: int | str) -> bool:
    return isinstance(value, int) and value < 0


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    """What a model's `sequence_batching` section asks for (slots across all its instances)."""

    strategy: Literal["direct", "oldest"]
    max_batch_size: int  # requests in one batch (1 for a model with no batch dimension)
    slots: int  # sequences live at once
    max_sequence_idle_us: int = _IDLE_DEFAULT_US
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    minimum_slot_utilization: float = 0.0
    max_backlog: int = 1024  # sequences waiting for a slot

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.slots < 1:
            raise ValueError("max_batch_size and slots must be >= 1")
        if self.max_sequence_idle_us < 1 or self.max_queue_delay_us < 0:
            raise ValueError("max_sequence_idle_us must be >= 1, max_queue_delay_us >= 0")
        object.__setattr__(
            self, "preferred_batch_sizes", tuple(sorted(set(self.preferred_batch_sizes)))
        )

    @classmethod
    def from_config(
        cls, config: mc.ModelConfig, instances: int, max_backlog: int = 1024
    ) -> SequencePolicy:
        """Read a model's `sequence_batching` section.

        Direct: `max_batch_size` slots per instance (one without a batch dimension). Oldest:
        `max_candidate_sequences` per instance (`max_batch_size` when unset).

        Raises:
            ModelConfigError: the config has no `sequence_batching`.
        """
        if not config.HasField("sequence_batching"):
            raise ModelConfigError(f"model '{config.name}' has no sequence_batching")
        sb = config.sequence_batching
        batch = max(1, config.max_batch_size)
        instances = max(1, instances)
        idle = sb.max_sequence_idle_microseconds or _IDLE_DEFAULT_US
        if sb.HasField("oldest"):
            oldest = sb.oldest
            return cls(
                strategy="oldest",
                max_batch_size=batch,
                slots=(oldest.max_candidate_sequences or batch) * instances,
                max_sequence_idle_us=idle,
                max_queue_delay_us=oldest.max_queue_delay_microseconds,
                preferred_batch_sizes=tuple(s for s in oldest.preferred_batch_size if s <= batch),
                max_backlog=max_backlog,
            )
        direct = sb.direct
        return cls(
            strategy="direct",
            max_batch_size=batch,
            slots=batch * instances,
            max_sequence_idle_us=idle,
            max_queue_delay_us=direct.max_queue_delay_microseconds,
            minimum_slot_utilization=direct.minimum_slot_utilization,
            max_backlog=max_backlog,
        )


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    """One request in a batch, with the control values its sequence gives it."""

    item: T
    correlation_id: CorrelationId
    start: bool  # first request of the sequence: its state starts over
    end: bool  # last request: the sequence is released after it runs


@dataclass(slots=True)
class _Queued(Generic[T]):
    item: T
    start: bool
    end: bool
    arrived: float


@dataclass(slots=True)
class _Sequence(Generic[T]):
    correlation_id: CorrelationId
    queue: deque[_Queued[T]] = field(default_factory=deque)
    running: bool = False
    ending: bool = False  # an END is queued: later requests belong to a new sequence
    last_active: float = 0.0
    waits_until: float = math.inf  # backlog only: refused when no slot frees by then


@dataclass(frozen=True, slots=True)
class Expired(Generic[T]):
    """What `expire()` removed: requests to refuse, and sequences whose state to drop."""

    refused: tuple[T, ...] = ()
    released: tuple[CorrelationId, ...] = ()


class SequenceBatcher(Generic[T]):
    """The live and waiting sequences of one model version and the batcher's decisions."""

    def __init__(self, policy: SequencePolicy, model: str = "") -> None:
        self.policy = policy
        self.model = model
        self._live: dict[CorrelationId, _Sequence[T]] = {}
        self._backlog: OrderedDict[CorrelationId, _Sequence[T]] = OrderedDict()
        self._retired: OrderedDict[CorrelationId, None] = OrderedDict()

    @property
    def live(self) -> int:
        """Sequences holding a slot."""
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Sequences in the backlog, waiting for a slot."""
        return len(self._backlog)

    def __len__(self) -> int:
        """Requests queued (not running), backlog included."""
        seqs = [*self._live.values(), *self._backlog.values()]
        return sum(len(s.queue) for s in seqs)

    def owns(self, corrid: CorrelationId) -> bool:
        """Whether a sequence with this id is live or waiting here."""
        return corrid in self._live or corrid in self._backlog

    def add(
        self,
        corrid: CorrelationId,
        item: T,
        *,
        start: bool,
        end: bool,
        now: float,
        timeout_us: int | None = None,
    ) -> None:
        """Queue a request of a sequence.

        A START for an id that is already live continues in its slot: the earlier sequence did
        not end, and its state starts over (as Triton does, with a warning left to the caller).

        Raises:
            InvalidInputError: no correlation id; a request without START for an unknown (or
                idled-out) sequence.
            OverloadedError: a new sequence finds the backlog full.
        """
        if corrid in (0, ""):
            raise InvalidInputError(
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        entry = _Queued(item, start, end, now)
        seq = self._live.get(corrid) or self._backlog.get(corrid)
        if seq is not None and (not seq.ending or start):
            seq.queue.append(entry)
            seq.ending = end
            seq.last_active = now
            return
        if not start:
            if corrid in self._retired:
                raise InvalidInputError(
                    f"inference request for sequence {corrid} to model '{self.model}' must "
                    "specify the START flag on the first request of the sequence: the sequence "
                    f"was released after {self.policy.max_sequence_idle_us} us idle "
                    "(max_sequence_idle_microseconds)"
                )
            raise InvalidInputError(
                f"inference request for sequence {corrid} to model '{self.model}' must specify "
                "the START flag on the first request of the sequence"
            )
        self._retired.pop(corrid, None)
        fresh = _Sequence[T](corrid, deque([entry]), ending=end, last_active=now)
        if len(self._live) < self.policy.slots and not self._backlog:
            self._live[corrid] = fresh
            return
        if len(self._backlog) >= self.policy.max_backlog:
            raise OverloadedError(
                f"model '{self.model}': all {self.policy.slots} sequence slots are taken and "
                f"{len(self._backlog)} sequences wait for one; retry later"
            )
        wait_us = timeout_us or self.policy.max_sequence_idle_us
        fresh.waits_until = now + wait_us * _US
        self._backlog[corrid] = fresh

    def expire(self, now: float) -> Expired[T]:
        """Release idle sequences (their slots go to the backlog) and refuse expired waiters.

        Returns:
            The backlog requests whose sequence found no slot in time (the caller fails them
            with 503), and the ids of the live sequences released for idling.
        """
        idle = self.policy.max_sequence_idle_us * _US
        released = [
            c
            for c, s in self._live.items()
            if not s.running and not s.queue and now >= s.last_active + idle
        ]
        for corrid in released:
            del self._live[corrid]
            self._retire(corrid)
        self._promote()
        refused: list[T] = []
        for corrid in [c for c, s in self._backlog.items() if now >= s.waits_until]:
            refused.extend(q.item for q in self._backlog.pop(corrid).queue)
        return Expired(tuple(refused), tuple(released))

    def take(self, now: float) -> list[Step[T]] | None:
        """Remove and return the requests to run together now, if the strategy says to.

        Returns:
            One request per sequence, oldest first; None when nothing is due (see `deadline()`).
        """
        ready = self._ready()
        if not ready:
            return None
        policy = self.policy
        limit = policy.max_batch_size
        delay = policy.max_queue_delay_us * _US
        waited = now >= ready[0].queue[0].arrived + delay
        if policy.strategy == "direct":
            needed = max(1, math.ceil(policy.minimum_slot_utilization * limit))
            count = min(len(ready), limit) if waited or len(ready) >= needed else 0
        elif waited or not delay:
            count = min(len(ready), limit)
        else:
            count = _count_now(len(ready), limit, policy.preferred_batch_sizes)
        if count == 0:
            return None
        steps = []
        for seq in ready[:count]:
            queued = seq.queue.popleft()
            seq.running = True
            steps.append(Step(queued.item, seq.correlation_id, queued.start, queued.end))
        return steps

    def done(self, steps: list[Step[T]], now: float) -> list[CorrelationId]:
        """A batch from `take()` has run (or failed): free the slots of the sequences it ended.

        Returns:
            The ids of the sequences that ended (their state is to be dropped).
        """
        ended = []
        for step in steps:
            seq = self._live.get(step.correlation_id)
            if seq is None:
                continue
            seq.running = False
            seq.last_active = now
            if step.end and not seq.queue:
                del self._live[step.correlation_id]
                ended.append(step.correlation_id)
        self._promote()
        return ended

    def deadline(self, *, batches: bool = True) -> float | None:
        """The earliest instant at which `expire()` or `take()` may answer differently.

        Args:
            batches: count when the next batch is due; False while the caller could not run
                one anyway (every instance busy), so that only idling and backlog expiry count.

        Returns:
            Monotonic seconds, or None when nothing will change without an arrival.
        """
        times = [s.waits_until for s in self._backlog.values()]
        idle = self.policy.max_sequence_idle_us * _US
        times.extend(
            s.last_active + idle for s in self._live.values() if not s.running and not s.queue
        )
        ready = self._ready() if batches else []
        if ready:
            times.append(ready[0].queue[0].arrived + self.policy.max_queue_delay_us * _US)
        return min(times, default=None)

    def drain(self) -> list[T]:
        """Remove every queued request (shutdown); live sequences are forgotten."""
        items = [q.item for s in [*self._live.values(), *self._backlog.values()] for q in s.queue]
        self._live.clear()
        self._backlog.clear()
        return items

    def _ready(self) -> list[_Sequence[T]]:
        ready = [s for s in self._live.values() if s.queue and not s.running]
        ready.sort(key=lambda s: s.queue[0].arrived)
        return ready

    def _promote(self) -> None:
        while self._backlog and len(self._live) < self.policy.slots:
            corrid, seq = self._backlog.popitem(last=False)
            seq.waits_until = math.inf
            self._live[corrid] = seq

    def _retire(self, corrid: CorrelationId) -> None:
        self._retired[corrid] = None
        if len(self._retired) > _RETIRED_KEPT:
            self._retired.popitem(last=False)


def _count_now(ready: int, limit: int, preferred: tuple[int, ...]) -> int:
    """Oldest strategy, before the delay is over: the largest preferred size reached, else 0."""
    reached = [size for size in preferred if size <= min(ready, limit)]
    if reached:
        return reached[-1]
    return min(ready, limit) if ready >= limit else 0
