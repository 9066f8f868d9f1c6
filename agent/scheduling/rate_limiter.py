"""Rate limiter across model instances: named resources and priority, Triton's semantics.

An instance group may declare `rate_limiter { resources [{name, count, global}] priority }`. An
execution may start only when every resource it declares is available; resource capacity is the
largest count any instance declares (as Triton sizes it without explicit resource flags), or what
the agent config sets. When several executions wait, grants follow weighted fair queueing: an
instance with priority p is charged p per grant, so priority 1 runs twice as often as priority 2
under contention and a heavy model cannot starve a latency-critical one.

Pure: no asyncio, no clock. The scheduler asks `try_acquire`, queues a waiter otherwise, and calls
`release`, which returns the waiters that were granted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.proto import model_config_pb2 as mc


@dataclass(frozen=True, slots=True)
class ResourceNeed:
    """What one execution of an instance group needs."""

    resources: tuple[tuple[str, int], ...] = ()
    priority: int = 1

    @classmethod
    def from_group(cls, group: mc.ModelInstanceGroup) -> ResourceNeed:
        """Read a group's rate_limiter block (priority 0 counts as 1)."""
        limiter = group.rate_limiter
        needs = tuple((r.name, r.count) for r in limiter.resources if r.count > 0)
        return cls(needs, max(1, limiter.priority))


@dataclass(slots=True)
class _Waiter:
    key: str
    need: ResourceNeed
    seq: int


@dataclass(slots=True)
class RateLimiter:
    """Grants executions against resource capacities, by weighted fair order among waiters."""

    capacity: dict[str, int] = field(default_factory=dict)
    _in_use: dict[str, int] = field(default_factory=dict)
    _virtual: dict[str, int] = field(default_factory=dict)  # charged priority per waiter key
    _waiting: list[_Waiter] = field(default_factory=list)
    _seq: int = 0

    def declare(self, need: ResourceNeed, overrides: Mapping[str, int] | None = None) -> None:
        """Register an instance group's needs; capacity grows to the largest single need."""
        for name, count in need.resources:
            configured = (overrides or {}).get(name)
            current = self.capacity.get(name, 0)
            self.capacity[name] = configured if configured is not None else max(current, count)

    def try_acquire(self, key: str, need: ResourceNeed) -> bool:
        """Take the resources now if nobody with an earlier turn is waiting; else queue `key`.

        Args:
            key: identifies the waiting execution (e.g. "model:version:seq").
            need: the resources and priority of its instance group.

        Returns:
            True when granted; False when queued (a later `release` returns it when granted).
        """
        if not need.resources:
            return True
        if not self._waiting and self._fits(need):
            self._take(key, need)
            return True
        self._seq += 1
        self._waiting.append(_Waiter(key, need, self._seq))
        return False

    def cancel(self, key: str) -> None:
        """Drop a queued waiter (its request went away)."""
        self._waiting = [w for w in self._waiting if w.key != key]

    def release(self, need: ResourceNeed) -> list[str]:
        """Give back one execution's resources.

        Returns:
            Keys of queued waiters now granted, in grant order.
        """
        for name, count in need.resources:
            self._in_use[name] = self._in_use.get(name, 0) - count
        granted = []
        while self._waiting:
            order = sorted(
                self._waiting, key=lambda w: (self._virtual.get(_group(w.key), 0), w.seq)
            )
            chosen = next((w for w in order if self._fits(w.need)), None)
            if chosen is None:
                break
            self._waiting.remove(chosen)
            self._take(chosen.key, chosen.need)
            granted.append(chosen.key)
        return granted

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _fits(self, need: ResourceNeed) -> bool:
        return all(
            self._in_use.get(name, 0) + count <= self.capacity.get(name, count)
            for name, count in need.resources
        )

    def _take(self, key: str, need: ResourceNeed) -> None:
        for name, count in need.resources:
            self._in_use[name] = self._in_use.get(name, 0) + count
        group = _group(key)
        # Weighted fair queueing: a grant costs the group its priority value.
        floor = min(self._virtual.values(), default=0)
        self._virtual[group] = max(self._virtual.get(group, 0), floor) + need.priority


def _group(key: str) -> str:
    """Waiter keys are "group#n"; fairness is kept per group."""
    return key.split("#", 1)[0]
