"""Canary rollouts, the pure core: route a share of traffic to a candidate version and judge it.

No clock, no randomness, no I/O: the caller supplies the uniform draw for each routing decision
and the measured latency of each request, so one run is reproducible from its inputs.

Invariants:

* `route(u)` sends a draw `u < share` to the candidate and every other draw to the baseline, so
  over uniform draws the candidate's share of traffic is `share`.
* Only candidate outcomes are judged. The window holds the last `window` candidate requests; no
  verdict is given before it holds `min_requests` of them.
* After each candidate outcome the window is judged first (error rate, then p95 latency); a
  breach rolls back. Otherwise the candidate is promoted once `promote_after` of its requests
  succeeded. A policy never promotes before the window could judge (`min_requests` <=
  `promote_after`).
* RUNNING is the only state that routes and records; PROMOTED, ROLLED_BACK and STOPPED are final.
  A call in the wrong state is a programmer error and raises `CanaryStateError`.

Usage:

    canary = Canary(CanaryPolicy(candidate=2, share=0.1), baseline=1)
    version = canary.route(rng.random())
    decision = canary.record(version, ok=True, latency_us=850)   # None, or PROMOTE / ROLLBACK
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_WINDOW = 100_000  # candidate requests kept for judging: bounds memory per canary
MAX_PROMOTE_AFTER = 1_000_000_000
_MAX_P95_MS = 2**31 // 1000  # max_p95_us is an int32 count of µs (as the other limits)
POLICY_KEYS = (
    "version",
    "share",
    "promote_after",
    "window",
    "min_requests",
    "max_error_rate",
    "max_p95_ms",
)


class CanaryPolicyError(ValueError):
    """A canary policy value is invalid; `key` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


class CanaryStateError(RuntimeError):
    """A canary was called in a state that does not allow the call (a programmer error)."""


class CanaryState(str, Enum):
    RUNNING = "RUNNING"
    PROMOTED = "PROMOTED"
    ROLLED_BACK = "ROLLED_BACK"
    STOPPED = "STOPPED"


class Action(str, Enum):
    PROMOTE = "PROMOTE"
    ROLLBACK = "ROLLBACK"


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    """How a candidate version is tried: its traffic share and the thresholds that judge it."""

    candidate: int
    share: float
    promote_after: int = 1000  # good candidate requests before promotion
    window: int = 100  # candidate requests judged (the most recent ones)
    max_error_rate: float = 0.05
    max_p95_us: int | None = None  # None: latency is not judged
    min_requests: int | None = None  # None: the window size

    def __post_init__(self) -> None:
        _positive_int("version", self.candidate)
        if not isinstance(self.share, float | int) or isinstance(self.share, bool):
            raise CanaryPolicyError("share", f"share must be a number, got {self.share!r}")
        if not 0.0 < self.share < 1.0:
            raise CanaryPolicyError("share", f"share must be in (0, 1), got {self.share!r}")
        _positive_int("promote_after", self.promote_after, MAX_PROMOTE_AFTER)
        _positive_int("window", self.window, MAX_WINDOW)
        if (
            not isinstance(self.max_error_rate, float | int)
            or isinstance(self.max_error_rate, bool)
            or not 0.0 <= self.max_error_rate < 1.0
        ):
            raise CanaryPolicyError(
                "max_error_rate", f"max_error_rate must be in [0, 1), got {self.max_error_rate!r}"
            )
        if self.max_p95_us is not None:
            _positive_int("max_p95_us", self.max_p95_us)
        if self.min_requests is not None:
            _positive_int("min_requests", self.min_requests, self.window)
        if self.judged_after > self.promote_after:
            raise CanaryPolicyError(
                "promote_after",
                f"promote_after ({self.promote_after}) must be >= min_requests "
                f"({self.judged_after}): a candidate is judged before it is promoted",
            )

    @property
    def judged_after(self) -> int:
        """Candidate requests in the window before a verdict is given."""
        return self.window if self.min_requests is None else self.min_requests

    def as_json(self) -> dict[str, Any]:
        """The policy in the wire form that `parse_policy` reads."""
        doc: dict[str, Any] = {
            "version": self.candidate,
            "share": self.share,
            "promote_after": self.promote_after,
            "window": self.window,
            "max_error_rate": self.max_error_rate,
        }
        if self.min_requests is not None:
            doc["min_requests"] = self.min_requests
        if self.max_p95_us is not None:
            doc["max_p95_ms"] = self.max_p95_us / 1000
        return doc


def parse_policy(doc: Mapping[str, Any]) -> CanaryPolicy:
    """A policy from its wire form (HTTP body, MQTT args, a TOML table).

    Keys: version (int, required), share (number in (0, 1), required), promote_after, window,
    min_requests (ints), max_error_rate (number in [0, 1)), max_p95_ms (number > 0).

    Raises:
        CanaryPolicyError: unknown key, missing key, wrong type or value; `key` names it.
    """
    for key in doc:
        if key not in POLICY_KEYS:
            raise CanaryPolicyError(
                str(key), f"unknown canary key '{key}' (known: {', '.join(POLICY_KEYS)})"
            )
    for key in ("version", "share"):
        if doc.get(key) is None:
            raise CanaryPolicyError(key, f"canary key '{key}' is required")
    p95_us: int | None = None
    raw_p95 = doc.get("max_p95_ms")
    if raw_p95 is not None:
        p95_ms = _finite_float("max_p95_ms", raw_p95)
        # The bound keeps the conversion to µs finite (1e308 ms would overflow to infinity).
        if not 0 < p95_ms <= _MAX_P95_MS:
            raise CanaryPolicyError(
                "max_p95_ms", f"max_p95_ms must be in (0, {_MAX_P95_MS}], got {raw_p95!r}"
            )
        p95_us = max(1, round(p95_ms * 1000))
    defaults = CanaryPolicy.__dataclass_fields__
    return CanaryPolicy(
        candidate=doc["version"],
        share=_finite_float("share", doc["share"]),
        promote_after=doc.get("promote_after", defaults["promote_after"].default),
        window=doc.get("window", defaults["window"].default),
        max_error_rate=_finite_float(
            "max_error_rate", doc.get("max_error_rate", defaults["max_error_rate"].default)
        ),
        max_p95_us=p95_us,
        min_requests=doc.get("min_requests"),
    )


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One version's outcomes in the current window."""

    version: int
    requests: int
    errors: int
    p95_us: int | None  # None: no request yet

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "p95_us": self.p95_us,
        }


@dataclass(frozen=True, slots=True)
class CanaryDecision:
    """A verdict on the candidate, with the figures it was drawn from."""

    action: Action
    candidate: int
    baseline: int
    window: WindowFigures  # the candidate's window when the verdict was given
    good_requests: int  # successful candidate requests since the start
    max_error_rate: float
    max_p95_us: int | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        """The decision as an event detail or status field."""
        return {
            "action": self.action.value,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "requests": self.window.requests,
            "errors": self.window.errors,
            "error_rate": round(self.window.error_rate, 4),
            "p95_us": self.window.p95_us,
            "good_requests": self.good_requests,
            "max_error_rate": self.max_error_rate,
            "max_p95_us": self.max_p95_us,
            "reason": self.reason,
        }


class _Window:
    """The last `size` outcomes of one version: (ok, latency µs), with the latencies kept sorted
    as well so that the p95 is one index (a sort per request would cost O(n log n))."""

    def __init__(self, size: int) -> None:
        self._items: deque[tuple[bool, int]] = deque()
        self._size = size
        self._sorted: list[int] = []
        self._errors = 0

    def add(self, ok: bool, latency_us: int) -> None:
        if len(self._items) == self._size:
            old_ok, old_latency = self._items.popleft()
            self._errors -= not old_ok
            del self._sorted[bisect.bisect_left(self._sorted, old_latency)]
        self._items.append((ok, latency_us))
        self._errors += not ok
        bisect.insort(self._sorted, latency_us)

    def figures(self, version: int) -> WindowFigures:
        return WindowFigures(version, len(self._items), self._errors, self._p95())

    def _p95(self) -> int | None:
        """Nearest-rank 95th percentile over every request in the window, failures included."""
        if not self._sorted:
            return None
        rank = (95 * len(self._sorted) + 99) // 100  # ceil(0.95 n), 1-based
        return self._sorted[rank - 1]


class Canary:
    """One canary rollout of a model (see module docstring)."""

    def __init__(self, policy: CanaryPolicy, baseline: int) -> None:
        if baseline == policy.candidate:
            raise CanaryPolicyError("version", f"candidate version {baseline} is also the baseline")
        _positive_int("baseline", baseline)
        self.policy = policy
        self.baseline = baseline
        self.state = CanaryState.RUNNING
        self.decision: CanaryDecision | None = None
        self.good_requests = 0
        self._windows = {
            policy.candidate: _Window(policy.window),
            baseline: _Window(policy.window),
        }

    @property
    def candidate(self) -> int:
        return self.policy.candidate

    def route(self, u: float) -> int:
        """The version for one request that names none, from a uniform draw `u` in [0, 1).

        Raises:
            CanaryStateError: the canary is not RUNNING.
            ValueError: `u` is outside [0, 1).
        """
        self._require_running("route")
        if not 0.0 <= u < 1.0:
            raise ValueError(f"draw must be in [0, 1), got {u!r}")
        return self.policy.candidate if u < self.policy.share else self.baseline

    def record(self, version: int, ok: bool, latency_us: int) -> CanaryDecision | None:
        """Record one routed request's outcome; returns a verdict when one is reached.

        Raises:
            CanaryStateError: the canary is not RUNNING.
            ValueError: `version` is neither the candidate nor the baseline, or latency < 0.
        """
        self._require_running("record")
        window = self._windows.get(version)
        if window is None:
            raise ValueError(
                f"version {version} is neither candidate {self.candidate} "
                f"nor baseline {self.baseline}"
            )
        if latency_us < 0:
            raise ValueError(f"latency must be >= 0, got {latency_us}")
        window.add(ok, latency_us)
        if version != self.candidate:
            return None
        if ok:
            self.good_requests += 1
        decision = self._judge(window.figures(version))
        if decision is not None:
            self.decision = decision
            promoted = decision.action is Action.PROMOTE
            self.state = CanaryState.PROMOTED if promoted else CanaryState.ROLLED_BACK
        return decision

    def stop(self) -> WindowFigures:
        """End the rollout by hand (traffic goes back to the baseline); returns the window.

        Raises:
            CanaryStateError: the canary is not RUNNING.
        """
        self._require_running("stop")
        self.state = CanaryState.STOPPED
        return self.figures(self.candidate)

    def figures(self, version: int) -> WindowFigures:
        """The current window of the candidate or the baseline.

        Raises:
            ValueError: `version` is neither the candidate nor the baseline.
        """
        window = self._windows.get(version)
        if window is None:
            raise ValueError(f"version {version} is not part of this canary")
        return window.figures(version)

    def _judge(self, seen: WindowFigures) -> CanaryDecision | None:
        policy = self.policy
        if seen.requests < policy.judged_after:
            return None
        over = f"over the last {seen.requests} requests"
        if seen.error_rate > policy.max_error_rate:
            reason = f"error rate {seen.error_rate:.2f} {over} > {policy.max_error_rate:g}"
            return self._decide(Action.ROLLBACK, seen, reason)
        limit = policy.max_p95_us
        if limit is not None and seen.p95_us is not None and seen.p95_us > limit:
            reason = f"p95 {seen.p95_us} us {over} > {limit} us"
            return self._decide(Action.ROLLBACK, seen, reason)
        if self.good_requests >= policy.promote_after:
            reason = (
                f"{self.good_requests} good requests; error rate {seen.error_rate:.2f} {over} "
                f"<= {policy.max_error_rate:g}"
            )
            if policy.max_p95_us is not None:
                reason += f", p95 {seen.p95_us} us <= {policy.max_p95_us} us"
            return self._decide(Action.PROMOTE, seen, reason)
        return None

    def _decide(self, action: Action, seen: WindowFigures, reason: str) -> CanaryDecision:
        return CanaryDecision(
            action,
            self.candidate,
            self.baseline,
            seen,
            self.good_requests,
            self.policy.max_error_rate,
            self.policy.max_p95_us,
            reason,
        )

    def _require_running(self, call: str) -> None:
        if self.state is not CanaryState.RUNNING:
            raise CanaryStateError(f"cannot {call}: the canary is {self.state.value}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite_float(key: str, value: Any) -> float:
    """A JSON number as a finite float (JSON text may carry Infinity, NaN or a 400-digit int)."""
    if not _is_number(value):
        raise CanaryPolicyError(key, f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise CanaryPolicyError(key, f"{key} must be a finite number, got {value!r}")
    return number


def _positive_int(key: str, value: Any, upper: int = 2**31) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise CanaryPolicyError(key, f"{key} must be an integer, got {value!r}")
    if not 1 <= value <= upper:
        raise CanaryPolicyError(key, f"{key} must be an integer in 1..{upper}, got {value}")
