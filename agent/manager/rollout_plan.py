"""What a fleet rollout is made of: its spec, each device's job, the commands it sends, and
the order and sizes of its waves. Pure.

The state machine that moves them is `agent.manager.rollout`. The targets are ordered once, at
start, by a hash of rollout id and device id (`target_order`), so the order is fixed and
spreads across sites; wave `i` covers the first `ceil(share_i * n)` of them, at least one
(`wave_size`). A job's state is one of `JOB_STATES`, the job-execution states of fleet tooling.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.manager.rollout_gate import GateRule, parse_gate

__all__ = [
    "BAD",
    "DONE",
    "FINAL",
    "JOB_STATES",
    "PHASES",
    "VIA",
    "Job",
    "RolloutSpec",
    "Send",
    "target_order",
    "wave_size",
]

JOB_STATES = ("queued", "in_progress", "succeeded", "failed", "timed_out", "rejected")
FINAL = frozenset({"succeeded", "failed", "timed_out", "rejected"})
BAD = frozenset({"failed", "timed_out", "rejected"})
PHASES = ("running", "soaking", "paused", "rolling_back", "succeeded", "aborted")
DONE = frozenset({"succeeded", "aborted"})
VIA = ("activate", "set-desired")
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_-]{1,48}$")


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What to roll out, where, and how carefully."""

    id: str
    model: str
    version: int
    group: str
    waves: tuple[float, ...] = (0.05, 0.25, 1.0)
    gate: str = ""
    soak_s: float = 600.0
    max_failed: int = 0
    job_timeout_s: float = 300.0
    min_requests: int = 0
    via: str = "activate"

    def __post_init__(self) -> None:
        if not self.waves or any(not 0 < w <= 1 for w in self.waves):
            raise ValueError("waves must be shares in (0, 1], e.g. 5%,25%,100%")
        if list(self.waves) != sorted(self.waves) or self.waves[-1] != 1.0:
            raise ValueError("waves must grow and end at 100%")
        if not _ROLLOUT_ID.match(self.id):
            raise ValueError("a rollout id is 1-48 of A-Z a-z 0-9 _ -")
        if self.via not in VIA:
            raise ValueError(f"via must be one of {', '.join(VIA)}")
        if self.soak_s < 0 or self.job_timeout_s <= 0 or self.max_failed < 0:
            raise ValueError("soak, job timeout and max failed devices must be >= 0")
        parse_gate(self.gate)

    @property
    def rules(self) -> tuple[GateRule, ...]:
        """The parsed gate."""
        return parse_gate(self.gate)


@dataclass(slots=True)
class Job:
    """One device's part in the rollout."""

    device: str
    wave: int
    state: str = "queued"
    previous: int | None = None
    step: int = 0  # which command of the sequence is out
    sent_at: float | None = None
    confirmed: bool = False  # the last command answered ok (serving is checked in the status)
    detail: str = ""
    rollback: str | None = None  # None, or a job state of the rollback
    rollback_step: int = 0
    rollback_sent_at: float | None = None
    rollback_confirmed: bool = False

    @property
    def touched(self) -> bool:
        """Whether the device was sent the version."""
        return self.sent_at is not None

    def to_json(self) -> dict[str, Any]:
        """The job's fields (what `dataclasses.asdict` gives, written out: asdict deep-copies
        each value, which made storing a 10,000-device rollout take over a second a step)."""
        return {
            "device": self.device,
            "wave": self.wave,
            "state": self.state,
            "previous": self.previous,
            "step": self.step,
            "sent_at": self.sent_at,
            "confirmed": self.confirmed,
            "detail": self.detail,
            "rollback": self.rollback,
            "rollback_step": self.rollback_step,
            "rollback_sent_at": self.rollback_sent_at,
            "rollback_confirmed": self.rollback_confirmed,
        }


@dataclass(frozen=True, slots=True)
class Send:
    """A command the driver publishes to a device."""

    device: str
    command_id: str
    command: str
    args: Mapping[str, Any]


def target_order(rollout_id: str, devices: Iterable[str]) -> list[str]:
    """The order in which a rollout reaches devices: by a hash of rollout and device id."""
    return sorted(devices, key=lambda d: hashlib.sha256(f"{rollout_id}/{d}".encode()).digest())


def wave_size(share: float, total: int) -> int:
    """Devices covered by a wave of `share` (cumulative; at least one)."""
    return min(total, max(1, math.ceil(share * total - 1e-9)))
