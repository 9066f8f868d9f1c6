"""Dynamic batch forming as Triton's dynamic batcher does it, with no clock, no asyncio and no I/O.

`BatchFormer` holds queued requests and decides, for an instant `now` that the caller passes in
(seconds of `time.monotonic()`), which of them run together next. `agent/scheduling/scheduler.py`
drives it:
`add()` on each arrival; on each wake-up `expire(now)` (fail what it returns), then `take(now)`
until it returns None, then sleep until `deadline()` or the next arrival.

Invariants:

* Queue order is: priority levels ascending (level 1 is the highest priority); within a level,
  requests in arrival order, then the level's delayed requests (timeout expired with action DELAY)
  in the order they expired. Like Triton, a delayed request waits behind the unexpired requests of
  its own and higher levels only, never behind a lower level's. Every batch is a prefix of this
  order: requests are never reordered, skipped over or split.
* A batch holds at most `max_batch_size` rows, and at most the `max_rows` given to `take()`.
* A request whose timeout expired with action REJECT is never put in a batch: `expire()` returns it.
* A level holds at most its `max_queue_size` requests (delayed ones included) unless that is 0.
* `now` never decreases from one call to the next (the caller's duty: it is not checked, so that
  `take(math.inf)` stays harmless).

Example:
    >>> former = BatchFormer[str](BatchingPolicy(max_batch_size=4, max_queue_delay_us=100))
    >>> former.add("a", rows=1, now=0.0)
    >>> former.take(0.00005) is None
    True
    >>> former.take(0.0001)
    Batch(items=('a',), rows=1, sizes=(1,))
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from agent.errors import InvalidInputError, ModelConfigError, OverloadedError
from agent.proto import model_config_pb2 as mc

T = TypeVar("T")

_US = 1e-6  # seconds per microsecond


class TimeoutAction(enum.Enum):
    """What happens to a queued request whose timeout expires (values as in the .proto)."""

    REJECT = 0  # removed from the queue and failed
    DELAY = 1  # kept, but runs after every unexpired request of its own and higher levels


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level.

    A request may only shorten the default timeout (a default of 0, no timeout, counts as infinite).
    """

    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no timeout
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    allow_timeout_override: bool = False

    def __post_init__(self) -> None:
        if self.max_queue_size < 0 or self.default_timeout_us < 0:
            raise ValueError("max_queue_size and default_timeout_us must be >= 0")


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """How queued requests are combined; `preserve_ordering` is the scheduler's (response order)."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()  # normalized: sorted, unique
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0: a single level
    default_priority_level: int = 0  # in 1..priority_levels when priority_levels > 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=dict)
    dynamic_batching: bool = True  # False: queue policies apply, but each request runs alone

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        preferred = tuple(sorted(set(self.preferred_batch_sizes)))
        if preferred and not 1 <= preferred[0] <= preferred[-1] <= self.max_batch_size:
            raise ValueError(f"preferred batch sizes {preferred} not in 1..{self.max_batch_size}")
        if self.max_queue_delay_us < 0 or self.priority_levels < 0:
            raise ValueError("max_queue_delay_us and priority_levels must be >= 0")
        levels = range(1, self.priority_levels + 1)
        if self.priority_levels and self.default_priority_level not in levels:
            raise ValueError(f"default_priority_level must be in 1..{self.priority_levels}")
        if any(level not in levels for level in self.priority_queue_policy):
            raise ValueError(f"priority_queue_policy keys must be in 1..{self.priority_levels}")
        object.__setattr__(self, "preferred_batch_sizes", preferred)
        object.__setattr__(
            self, "priority_queue_policy", MappingProxyType(dict(self.priority_queue_policy))
        )

    @classmethod
    def from_config(
        cls, config: mc.ModelConfig, max_batch_size: int | None = None
    ) -> BatchingPolicy:
        """Read a model's `dynamic_batching` section.

        Args:
            config: the parsed config.pbtxt.
            max_batch_size: a lower cap than the config's (memory-aware sizing); preferred sizes
                above it are dropped. None: the config's `max_batch_size`.

        Raises:
            ModelConfigError: a preferred size, priority level or queue policy key out of range.
            ValueError: `max_batch_size` is given and below 1.

        Returns:
            The policy; `unbatched()` when the config has no `dynamic_batching`, and a queue-only
            policy (`dynamic_batching=False`) when the model has no batch dimension.
        """
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size cap must be >= 1, got {max_batch_size}")
        model_max = config.max_batch_size
        if model_max < 0:
            raise ModelConfigError(f"max_batch_size {model_max} must be >= 0")
        cap = max(model_max, 1)
        if max_batch_size is not None:
            cap = min(cap, max_batch_size)
        if not config.HasField("dynamic_batching"):
            return cls.unbatched(cap)
        db = config.dynamic_batching
        bad = [size for size in db.preferred_batch_size if not 1 <= size <= model_max]
        if bad:
            raise ModelConfigError(
                f"dynamic_batching.preferred_batch_size {bad} not in 1..max_batch_size {model_max}"
            )
        levels = db.priority_levels
        if levels and not 1 <= db.default_priority_level <= levels:
            raise ModelConfigError(
                f"dynamic_batching.default_priority_level {db.default_priority_level}"
                f" not in 1..priority_levels {levels}"
            )
        bad = [level for level in db.priority_queue_policy if not 1 <= level <= levels]
        if bad:
            raise ModelConfigError(
                f"dynamic_batching.priority_queue_policy levels {sorted(bad)}"
                f" not in 1..priority_levels {levels}"
            )
        return cls(
            max_batch_size=cap,
            preferred_batch_sizes=tuple(s for s in db.preferred_batch_size if s <= cap),
            max_queue_delay_us=db.max_queue_delay_microseconds,
            preserve_ordering=db.preserve_ordering,
            priority_levels=levels,
            default_priority_level=db.default_priority_level if levels else 0,
            default_queue_policy=_queue_policy(db.default_queue_policy),
            priority_queue_policy={
                k: _queue_policy(v) for k, v in db.priority_queue_policy.items()
            },
            dynamic_batching=model_max > 0,
        )

    @classmethod
    def unbatched(cls, max_batch_size: int = 1) -> BatchingPolicy:
        """No dynamic batching: each request runs alone, as soon as it is first in the queue.

        Args:
            max_batch_size: the most rows one request may carry (1 for a model with no batch
                dimension).

        Returns:
            A single-level policy with an unbounded queue, no timeouts and no delay.
        """
        return cls(max_batch_size=max_batch_size, dynamic_batching=False)

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of a priority level (the default one when none is given for it)."""
        return self.priority_queue_policy.get(level, self.default_queue_policy)


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """Requests to run together, in queue order; `sizes[i]` is the row count of `items[i]`."""

    items: tuple[T, ...]
    rows: int
    sizes: tuple[int, ...]


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    rows: int
    enqueued: float
    expires: float | None  # monotonic seconds; None: no timeout (or already delayed)


@dataclass(slots=True)
class _Level(Generic[T]):
    policy: QueuePolicy
    queue: deque[_Entry[T]] = field(default_factory=deque)
    delayed: deque[_Entry[T]] = field(default_factory=deque)
    # Entries of `queue` with a timeout. Without queue policies it stays 0, and the per-arrival
    # sweeps and deadline scans skip the level instead of walking every queued request.
    timed: int = 0

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class BatchFormer(Generic[T]):
    """The queues of one model and the dynamic batcher's decisions over them."""

    __slots__ = ("_levels", "_policy", "_rejected")

    def __init__(self, policy: BatchingPolicy) -> None:
        self._policy = policy
        count = max(policy.priority_levels, 1)
        self._levels = {n: _Level[T](policy.queue_policy(n)) for n in range(1, count + 1)}
        self._rejected: list[_Entry[T]] = []  # expired with REJECT, not yet handed out

    @property
    def policy(self) -> BatchingPolicy:
        """The policy this former applies."""
        return self._policy

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    @property
    def pending_rows(self) -> int:
        """Rows of all queued requests."""
        return sum(entry.rows for entry in self._ordered())

    def queued(self) -> Iterator[tuple[T, int]]:
        """The queued requests and their rows, in the order `take()` considers them."""
        for entry in self._ordered():
            yield entry.item, entry.rows

    @property
    def level_sizes(self) -> dict[int, int]:
        """Queued requests per priority level (level 1 alone when there are no levels)."""
        return {n: len(level) for n, level in self._levels.items()}

    def add(
        self,
        item: T,
        rows: int,
        now: float,
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
    ) -> None:
        """Queue a request.

        Args:
            item: the request, handed back unchanged in a `Batch` or by `expire()`.
            rows: its batch size (1 for a model with no batch dimension).
            now: monotonic seconds.
            priority: its level, 1 the highest; None or 0: the default level. Ignored when the
                policy has no priority levels.
            timeout_us: its queue timeout; applied only when its level allows overrides and it
                is shorter than the level's default. None or 0: the default.

        Raises:
            InvalidInputError: rows not in 1..max_batch_size, priority out of range, negative
                timeout.
            OverloadedError: the request's level already holds `max_queue_size` requests.
        """
        limit = self._policy.max_batch_size
        if not 1 <= rows <= limit:
            raise InvalidInputError(f"batch size {rows} is not in 1..{limit} (max_batch_size)")
        level_no = self._level_of(priority)
        if timeout_us is not None and timeout_us < 0:
            raise InvalidInputError(f"timeout {timeout_us} us must be >= 0")
        self._sweep(now)  # requests that just expired with REJECT no longer hold a queue slot
        level = self._levels[level_no]
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise OverloadedError(
                f"Exceeds maximum queue size: queue of priority level {level_no} is full"
                f" (max_queue_size {policy.max_queue_size} requests)"
            )
        timeout = policy.default_timeout_us
        if policy.allow_timeout_override and timeout_us and (not timeout or timeout_us < timeout):
            timeout = timeout_us
        expires = now + timeout * _US if timeout else None
        level.queue.append(_Entry(item, rows, now, expires))
        if expires is not None:
            level.timed += 1

    def expire(self, now: float) -> list[T]:
        """Apply queue timeouts: move DELAY requests back, remove REJECT ones.

        Args:
            now: monotonic seconds.

        Returns:
            The requests removed because their timeout expired with action REJECT (including any
            that an earlier `add()` or `take()` set aside), in queue order; the caller fails them.
        """
        self._sweep(now)
        rejected, self._rejected = self._rejected, []
        return [entry.item for entry in rejected]

    def drain(self) -> list[T]:
        """Remove everything: for shutdown, or to move the requests to a former with a new policy.

        Returns:
            The requests set aside as rejected but not yet returned by `expire()`, then every
            queued request in queue order. No timeout is applied.
        """
        entries = self._rejected + list(self._ordered())
        self._rejected = []
        for level in self._levels.values():
            level.queue.clear()
            level.delayed.clear()
            level.timed = 0
        return [entry.item for entry in entries]

    def take(self, now: float, max_rows: int | None = None) -> Batch[T] | None:
        """Remove and return the batch to run now, if the policy says to run one.

        A batch runs at once when it reaches a preferred size (the largest one that a prefix of
        the queue reaches exactly), or when the queue holds more rows than the largest preferred
        size (max_batch_size when none are set): arrivals only add longer prefixes, so waiting
        could not do better. Otherwise it waits until the oldest request has waited
        max_queue_delay_us, then takes all that fit. With a zero delay it never waits.

        Args:
            now: monotonic seconds.
            max_rows: a lower cap on rows for this batch (free memory); None: max_batch_size.

        Raises:
            ValueError: max_rows < 1.

        Returns:
            The batch, or None: nothing is due (see `deadline()`), or the first request in the
            queue has more rows than `max_rows`.
        """
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self._sweep(now)
        policy = self._policy
        cap = policy.max_batch_size if max_rows is None else min(max_rows, policy.max_batch_size)
        rows = self._leading_rows(cap)
        if not rows or rows[0] > cap:
            return None
        if not policy.dynamic_batching:
            count = 1
        else:
            oldest = self._oldest()
            delay = policy.max_queue_delay_us * _US
            if delay and oldest is not None and now >= oldest + delay:
                count = _fitting(rows, cap)
            else:
                count = _count_now(rows, cap, policy.preferred_batch_sizes, waits=delay > 0)
        if count == 0:
            return None
        taken = self._pop(count)
        sizes = tuple(entry.rows for entry in taken)
        return Batch(tuple(entry.item for entry in taken), sum(sizes), sizes)

    def deadline(self) -> float | None:
        """The earliest instant at which `expire()` or `take()` may answer differently.

        Arrivals aside; a value at or before now means "due now". `max_rows` is not considered.

        Returns:
            Monotonic seconds, or None when nothing is queued or set aside.
        """
        expiry = self.expiry_deadline()
        times = [] if expiry is None else [expiry]
        oldest = self._oldest()
        if oldest is not None:
            batching = self._policy.dynamic_batching
            times.append(oldest + self._policy.max_queue_delay_us * _US if batching else oldest)
        return min(times, default=None)

    def expiry_deadline(self) -> float | None:
        """The earliest queue timeout among queued (or already expired) requests, if any.

        Returns:
            Monotonic seconds, or None when no queued request has a timeout.
        """
        times = [entry.expires for entry in self._rejected if entry.expires is not None]
        for level in self._levels.values():
            if level.timed:
                times.extend(entry.expires for entry in level.queue if entry.expires is not None)
        return min(times, default=None)

    def _level_of(self, priority: int | None) -> int:
        levels = self._policy.priority_levels
        if levels == 0:
            return 1
        if priority is None or priority == 0:
            return self._policy.default_priority_level
        if not 1 <= priority <= levels:
            raise InvalidInputError(f"priority {priority} is not in 1..{levels} for this model")
        return priority

    def _sweep(self, now: float) -> None:
        for level in self._levels.values():
            if not level.timed or all(e.expires is None or now < e.expires for e in level.queue):
                continue
            kept: deque[_Entry[T]] = deque()
            for entry in level.queue:
                if entry.expires is None or now < entry.expires:
                    kept.append(entry)
                elif level.policy.timeout_action is TimeoutAction.DELAY:
                    entry.expires = None
                    level.delayed.append(entry)
                else:
                    self._rejected.append(entry)
            level.queue = kept
            level.timed = sum(1 for entry in kept if entry.expires is not None)

    def _deques(self) -> Iterator[deque[_Entry[T]]]:
        """The queues in batch order: levels ascending, each its unexpired then delayed requests."""
        for level in self._levels.values():  # built in ascending level order
            yield level.queue
            yield level.delayed

    def _ordered(self) -> Iterator[_Entry[T]]:
        for queue in self._deques():
            yield from queue

    def _leading_rows(self, cap: int) -> list[int]:
        """The rows of the requests in queue order, up to and including the first that brings
        the total over `cap`: `take()` never looks past that one, however long the queue."""
        rows: list[int] = []
        total = 0
        for entry in self._ordered():
            rows.append(entry.rows)
            total += entry.rows
            if total > cap:
                break
        return rows

    def _oldest(self) -> float | None:
        # A level's queue is in arrival order, so its head is its oldest; delayed requests are
        # in expiry order and are all looked at.
        times = [level.queue[0].enqueued for level in self._levels.values() if level.queue]
        for level in self._levels.values():
            times.extend(entry.enqueued for entry in level.delayed)
        return min(times, default=None)

    def _pop(self, count: int) -> list[_Entry[T]]:
        taken: list[_Entry[T]] = []
        for level in self._levels.values():
            while level.queue and len(taken) < count:
                entry = level.queue.popleft()
                if entry.expires is not None:
                    level.timed -= 1
                taken.append(entry)
            while level.delayed and len(taken) < count:
                taken.append(level.delayed.popleft())
        return taken


def _fitting(rows: list[int], cap: int) -> int:
    """How many leading requests fit in `cap` rows."""
    total = 0
    for count, size in enumerate(rows):
        total += size
        if total > cap:
            return count
    return len(rows)


def _count_now(rows: list[int], cap: int, preferred_sizes: tuple[int, ...], *, waits: bool) -> int:
    """How many leading requests to run before the queue delay is over; 0: wait."""
    preferred = [size for size in preferred_sizes if size <= cap]
    target = preferred[-1] if preferred else cap
    best = total = 0
    for count, size in enumerate(rows):
        if count and total + size > target:
            return best or count
        total += size
        if total in preferred:
            best = count + 1
    if best:
        return best
    if total >= target or not waits:
        return len(rows)
    return 0


def _queue_policy(msg: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=msg.max_queue_size,
        default_timeout_us=msg.default_timeout_microseconds,
        timeout_action=TimeoutAction(int(msg.timeout_action)),
        allow_timeout_override=msg.allow_timeout_override,
    )
