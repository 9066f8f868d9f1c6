"""How a model version's instances stay healthy: the restart policy and each instance's record.

Pure: time comes in as arguments, nothing here reads a clock, starts a thread or a process. The
backends whose instances can fail while serving drive it: the Python backend's worker processes
(`agent.backends.python.supervisor`: a worker that exits, is killed, or stops answering its
heartbeats) and the in-process sessions of ONNX Runtime and TensorRT
(`agent.backends.session_health`: a session whose health probe fails after a run raised).

Rules (docs/operations.md, "Health of models"):

* An instance that fails is DOWN at once, with the reason. It is started again after a back-off:
  `backoff_s` after its first failure, doubled after each consecutive one, at most
  `backoff_max_s`. A start that fails (initialize raised, timed out) is a failure too.
* Failures are consecutive until the instance has been UP for `reset_after_s`: then its count
  starts again from zero (a worker killed by the OOM killer once a day is never given up).
* The failure that would need restart number `restart_limit + 1` in a row gives the whole
  version up: it stays UNAVAILABLE with the reason, and nothing is restarted any more (one
  `GAVE_UP` change; the operator reloads the model). `restart_limit = 0`: no restarts at all.
* The version is ready while at least one instance is UP and it has not given up; its requests
  go to the instances that are UP.

`VersionHealth` is the state machine of one version; its owner serializes the calls (one lock)
and publishes `state` (a frozen `HealthState`) for readers on other threads, who read that one
reference. Each call that changes something returns a `HealthChange` for the event sinks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ChangeKind",
    "HealthChange",
    "HealthListener",
    "HealthState",
    "RestartPolicy",
    "VersionHealth",
]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When failed instances are started again, and when a version gives up (seconds)."""

    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    restart_limit: int = 5  # restarts in a row before the version gives up; 0: none
    reset_after_s: float = 60.0  # UP this long: the instance's failures are forgotten
    # Python workers: a PING every interval; no PONG within the timeout is a hang.
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0

    def delay_s(self, failures: int) -> float:
        """The back-off before restart number `failures` in a row (1 is the first)."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, failures - 1)))


class ChangeKind(enum.Enum):
    """What happened to an instance."""

    FAILED = "instance_failed"  # DOWN; restarted after `restart_in_s`
    RESTARTED = "instance_restarted"  # UP again
    GAVE_UP = "crash_loop"  # the version gave up: UNAVAILABLE until reloaded


@dataclass(frozen=True, slots=True)
class HealthChange:
    """One change of a version's health, for the event sinks (`kind.value` is the event)."""

    kind: ChangeKind
    instance: str  # Triton's instance name (GROUP_INDEX) or "session"
    reason: str  # why it failed (FAILED, GAVE_UP); "" for RESTARTED
    live: int  # instances UP after the change
    instances: int
    failures: int  # consecutive failures of this instance (0 once it is UP again)
    restart_in_s: float | None = None  # FAILED: when it is started again

    @property
    def ready(self) -> bool:
        """Whether the version can serve after this change."""
        return self.live > 0 and self.kind is not ChangeKind.GAVE_UP

    def detail(self) -> dict[str, object]:
        """The event's detail: instance, live/instances, ready, and what applies of reason,
        failures and restart_in_s."""
        doc: dict[str, object] = {
            "instance": self.instance,
            "live": self.live,
            "instances": self.instances,
            "ready": self.ready,
        }
        if self.reason:
            doc["reason"] = self.reason
        if self.failures:
            doc["failures"] = self.failures
        if self.restart_in_s is not None:
            doc["restart_in_s"] = round(self.restart_in_s, 3)
        return doc


# Told each change, from the thread that made it (never the event loop): must not block.
HealthListener = Callable[[HealthChange], None]


@dataclass(frozen=True, slots=True)
class HealthState:
    """A version's health as readers see it (one reference, replaced on each change)."""

    instances: int
    live: int
    down: tuple[str, ...] = ()  # one line per instance that is DOWN: why, and when it restarts
    gave_up: str = ""  # why the version gave up ("" while it has not)

    @property
    def ready(self) -> bool:
        return self.live > 0 and not self.gave_up

    @property
    def reason(self) -> str:
        """For the repository index: why it cannot serve, or which instances are down."""
        if self.gave_up:
            return self.gave_up
        if not self.down:
            return ""
        lines = "; ".join(self.down)
        if self.live == 0:
            return f"no instance is serving: {lines}"
        return f"{self.instances - self.live} of {self.instances} instances down: {lines}"


class _Up(enum.Enum):
    UP = "up"
    DOWN = "down"
    STARTING = "starting"


@dataclass(slots=True)
class _Instance:
    name: str
    state: _Up
    since: float  # UP: since when; DOWN: when it failed
    failures: int = 0
    reason: str = ""
    restart_at: float | None = None


class VersionHealth:
    """The instances of one version: which are UP, which wait to be restarted (pure)."""

    def __init__(self, names: list[str], policy: RestartPolicy, now: float) -> None:
        """All instances UP at `now` (the version just loaded)."""
        self.policy = policy
        self._instances = [_Instance(name, _Up.UP, now) for name in names]
        self._gave_up = ""
        self.state = self._publish()

    @property
    def gave_up(self) -> str:
        return self._gave_up

    def name(self, index: int) -> str:
        return self._instances[index].name

    def failed(self, index: int, reason: str, now: float) -> HealthChange | None:
        """Instance `index` failed (it died, hung, or its session failed its probe) at `now`.

        Returns:
            FAILED (restart after the back-off) or GAVE_UP; None when the version had given up
            already or the instance was DOWN already (one failure is told once).
        """
        item = self._instances[index]
        if self._gave_up or item.state is not _Up.UP:
            return None
        if now - item.since >= self.policy.reset_after_s:
            item.failures = 0
        return self._fail(item, reason, now)

    def _fail(self, item: _Instance, reason: str, now: float) -> HealthChange:
        item.failures += 1
        item.state, item.since, item.reason = _Up.DOWN, now, reason
        if item.failures > self.policy.restart_limit:
            item.restart_at = None
            restarts = item.failures - 1
            self._gave_up = (
                f"instance {item.name} failed {item.failures} time(s) in a row"
                + (f" ({restarts} restart(s))" if restarts else " (restarts are off)")
                + f", the last: {reason}; the version is given up: load the model again"
            )
            self.state = self._publish()
            return HealthChange(
                ChangeKind.GAVE_UP, item.name, self._gave_up, 0, len(self._instances), item.failures
            )
        delay = self.policy.delay_s(item.failures)
        item.restart_at = now + delay
        self.state = self._publish()
        return HealthChange(
            ChangeKind.FAILED,
            item.name,
            reason,
            self.state.live,
            len(self._instances),
            item.failures,
            delay,
        )

    def due(self, now: float) -> list[int]:
        """Instances whose restart is due at `now`; each is STARTING from then on."""
        found = []
        for index, item in enumerate(self._instances):
            if item.state is _Up.DOWN and item.restart_at is not None and item.restart_at <= now:
                item.state, item.restart_at = _Up.STARTING, None
                found.append(index)
        if found:
            self.state = self._publish()
        return found

    def next_due(self) -> float | None:
        """When the next restart is due (None: none waits)."""
        times = [i.restart_at for i in self._instances if i.restart_at is not None]
        return min(times) if times and not self._gave_up else None

    def restart_failed(self, index: int, reason: str, now: float) -> HealthChange | None:
        """A restart of instance `index` failed (its start or initialize): one more failure in
        a row. None when the version gave up meanwhile."""
        item = self._instances[index]
        if self._gave_up or item.state is not _Up.STARTING:
            return None
        return self._fail(item, f"restart failed: {reason}", now)

    def restarted(self, index: int, now: float) -> HealthChange | None:
        """Instance `index` is UP again (initialized). None when the version gave up meanwhile."""
        item = self._instances[index]
        if self._gave_up or item.state is not _Up.STARTING:
            return None
        item.state, item.since, item.reason = _Up.UP, now, ""
        self.state = self._publish()  # its failures are kept until it has been UP reset_after_s
        return HealthChange(
            ChangeKind.RESTARTED,
            item.name,
            "",
            self.state.live,
            len(self._instances),
            item.failures,
        )

    def _publish(self) -> HealthState:
        live = sum(i.state is _Up.UP for i in self._instances)
        down = tuple(
            f"instance {i.name} {_status(i, self.policy.restart_limit)}"
            for i in self._instances
            if i.state is not _Up.UP
        )
        if self._gave_up:
            return HealthState(len(self._instances), 0, down, self._gave_up)
        return HealthState(len(self._instances), live, down)


def _status(item: _Instance, limit: int) -> str:
    if item.state is _Up.STARTING:
        return f"restarting (restart {item.failures} of at most {limit}) after: {item.reason}"
    return f"down ({item.reason}); restart {item.failures} of at most {limit} after a back-off"
