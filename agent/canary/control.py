"""Canary rollouts on a running agent: the per-model canaries, their draws, pins and events.

`CanaryManager` is the edge around the pure `agent.canary.policy` core. HTTP, MQTT and the config
file
all start and stop canaries through it, and the data plane asks it where each request that names
no version goes (`route`) and tells it how the request went (`record`).

Invariants:

* Only requests that name no version are routed and recorded; an explicit version is served as
  asked and never counted.
* After a verdict the model's unversioned traffic is pinned: to the candidate once it is
  promoted, to the baseline once it is rolled back or stopped. A pin, like a running canary,
  belongs to the set of versions the model served when it started: once the model serves another
  set (reload, swap, activate), the running canary is stopped and the pin is dropped, and
  unversioned requests go to the latest READY version again. The check is made on the model's
  next request, status query or start, so its event comes then, not at the swap itself.
* Every change is an event (canary_started, canary_promoted, canary_rolled_back, canary_stopped,
  canary_refused) whose detail holds the figures, through the agent's `EventSink` (behind an
  `EventTee`: a failing sink never fails a request or a verdict).
* With a state file (the agent has a cache directory), pins and running canaries survive a
  restart: the file is replaced atomically and durably after every change. A resumed canary
  starts its counts and window afresh. Without a state file they live in memory only.
* The state file is never a reason to stop serving: a write that fails is a
  `canary_state_write_failed` event (the decision holds in memory), and a corrupt or unreadable
  file at start-up is a `canary_state_corrupt` event (it is ignored, and replaced on the next
  change).
* Called on the event loop only (no locking); a decision's file write is small and rare.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.canary.policy import (
    Action,
    Canary,
    CanaryDecision,
    CanaryPolicy,
    CanaryPolicyError,
    CanaryState,
    parse_policy,
)
from agent.errors import (
    AgentError,
    BackendError,
    ConflictError,
    InternalError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    OverloadedError,
    RequestTimeoutError,
)
from agent.models.events import (
    CANARY_STATE_CORRUPT,
    CANARY_STATE_WRITE_FAILED,
    EventSink,
    EventTee,
    guarded,
)
from agent.models.registry import ModelRegistry
from model_cache.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

STATE_FILE = "canary.json"
_SCHEMA = 1
# Failures that say something about the version that served the request (an unexpected
# exception included). A client's bad input or a model that is being swapped says nothing about
# it and is not recorded.
_VERSION_FAILURES = (BackendError, RequestTimeoutError, OverloadedError, InternalError)


def policy_from_request(doc: Mapping[str, Any]) -> CanaryPolicy:
    """A policy from an HTTP body or MQTT arguments.

    Raises:
        InvalidInputError: a key is unknown, missing, of the wrong type or out of range.
    """
    try:
        return parse_policy(doc)
    except CanaryPolicyError as exc:
        raise InvalidInputError(exc.message) from None


@dataclass(slots=True)
class _Entry:
    """One model's canary (running or finished) and its pin."""

    versions: tuple[int, ...]  # the READY versions when the canary started or the pin was set
    canary: Canary | None = None
    pin: int | None = None  # where unversioned requests go after a verdict


class CanaryManager:
    """Holds every model's canary (see module docstring).

    Args:
        registry: The served models (which versions are READY).
        events: Where canary events go; the daemon passes its `EventTee`.
        rng: The source of routing draws; seed one for reproducible tests.
        state_path: The JSON file that keeps pins and running canaries; None: memory only.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        events: EventSink | None = None,
        *,
        rng: random.Random | None = None,
        state_path: Path | None = None,
    ) -> None:
        self._registry = registry
        self._events = guarded(events)
        self._rng = rng or random.Random()  # noqa: S311 - traffic split, not security
        self._path = state_path
        self._entries: dict[str, _Entry] = self._load() if state_path is not None else {}

    @property
    def events(self) -> EventTee:
        """Where canary events go; a sink set here is put behind an `EventTee`."""
        return self._events

    @events.setter
    def events(self, sink: EventSink) -> None:
        self._events = guarded(sink)

    @property
    def persistent(self) -> bool:
        """Whether pins and running canaries survive a restart."""
        return self._path is not None

    def startup(self, configured: Iterable[tuple[str, CanaryPolicy]]) -> None:
        """Once the models are loaded: check resumed state, then start the configured canaries.

        A configured canary is skipped when the model already has a running canary (resumed)
        or a pin (a verdict for these versions was reached before the restart). One that cannot
        start is logged, with a canary_refused event that says why.
        """
        for name in sorted(self._entries):
            self._check_versions(name)
        for name, policy in configured:
            entry = self._entries.get(name)
            if entry is not None and (entry.pin is not None or _running(entry)):
                logger.info(
                    "canary for model %s from the config not started: %s",
                    name,
                    "one is running" if _running(entry) else f"pinned to version {entry.pin}",
                    extra={"model": name},
                )
                continue
            try:
                self.start(name, policy)
            except AgentError as exc:
                logger.error(
                    "canary for model %s from the config refused: %s",
                    name,
                    exc.message,
                    extra={"model": name, "version": policy.candidate},
                )
                self.events.record(
                    name,
                    policy.candidate,
                    "canary_refused",
                    {"reason": exc.message, "source": "config", **policy.as_json()},
                )

    def route(self, name: str) -> int | None:
        """The version for a request to `name` that names none; None: the registry's default."""
        entry = self._entries.get(name)
        if entry is None or not self._check_versions(name):
            return None
        if entry.canary is not None and entry.canary.state is CanaryState.RUNNING:
            return entry.canary.route(self._rng.random())
        return entry.pin

    def record(self, name: str, version: int, latency_us: int, error: AgentError | None) -> None:
        """A routed request's outcome (`error` None: it succeeded)."""
        entry = self._entries.get(name)
        if entry is None or not _running(entry):
            return  # e.g. in flight while a verdict was reached
        if error is not None and not isinstance(error, _VERSION_FAILURES):
            return
        canary = entry.canary
        assert canary is not None
        if version not in (canary.candidate, canary.baseline):
            return
        decision = canary.record(version, error is None, latency_us)
        if decision is not None:
            self._apply(name, entry, decision)

    def start(self, name: str, policy: CanaryPolicy) -> dict[str, Any]:
        """Start a canary; returns its status.

        Raises:
            ModelNotFoundError: unknown model, or the candidate is not a READY version.
            ModelNotReadyError: the model has no READY version.
            ConflictError: a canary already runs for the model.
            InvalidInputError: the candidate is the baseline (no other READY version, or
                unversioned traffic is already pinned to it).
        """
        served, _ = self._registry.resolve(name, None)
        versions = tuple(sorted(served.versions))
        self._check_versions(name)
        entry = self._entries.get(name)
        if entry is not None and _running(entry):
            assert entry.canary is not None
            raise ConflictError(
                f"a canary already runs for model '{name}' (candidate version "
                f"{entry.canary.candidate}); stop it first"
            )
        if policy.candidate not in versions:
            raise ModelNotFoundError(
                f"version {policy.candidate} of model '{name}' is not READY "
                f"(READY: {list(versions)})"
            )
        pin = entry.pin if entry is not None else None
        others = [v for v in versions if v != policy.candidate]
        baseline = pin if pin is not None else (max(others) if others else policy.candidate)
        if baseline == policy.candidate:
            why = "is pinned to it" if pin is not None else "has no other READY version"
            raise InvalidInputError(
                f"candidate version {policy.candidate} is the baseline: model '{name}' {why}"
            )
        canary = Canary(policy, baseline)
        self._entries[name] = _Entry(versions, canary, pin)
        self._save()
        detail = {**policy.as_json(), "baseline": baseline, "persistent": self.persistent}
        logger.info(
            "canary for model %s: %.0f%% of unversioned traffic to version %d, rest to %d",
            name,
            policy.share * 100,
            policy.candidate,
            baseline,
            extra={"model": name, "version": policy.candidate},
        )
        self.events.record(name, policy.candidate, "canary_started", detail)
        return self.status(name)

    def stop(self, name: str) -> dict[str, Any]:
        """Stop the running canary (unversioned traffic is pinned to the baseline), or, when none
        runs, drop the pin (unversioned traffic goes to the latest READY version again).

        Raises:
            ModelNotFoundError: unknown model, or it has neither a running canary nor a pin.
        """
        self._registry.resolve(name, None)
        self._check_versions(name)
        entry = self._entries.get(name)
        if entry is not None and _running(entry):
            assert entry.canary is not None
            self._end(name, entry, "stopped on request")
            return self.status(name)
        if entry is None or entry.pin is None:
            raise ModelNotFoundError(f"model '{name}' has no running canary and no pinned version")
        dropped, entry.pin = entry.pin, None
        self._save()
        self.events.record(name, dropped, "canary_stopped", {"reason": "pin dropped on request"})
        return self.status(name)

    def status(self, name: str) -> dict[str, Any]:
        """The model's canary: state, versions, share, window figures, the last verdict, the pin.

        Raises:
            ModelNotFoundError: unknown model.
        """
        # A known model that is not served still has a canary state worth reporting.
        with contextlib.suppress(ModelNotReadyError):
            self._registry.resolve(name, None)
        self._check_versions(name)
        entry = self._entries.get(name)
        doc: dict[str, Any] = {
            "model": name,
            "state": "NONE",
            "pinned_version": entry.pin if entry else None,
            "persistent": self.persistent,
        }
        if entry is None or entry.canary is None:
            return doc
        canary = entry.canary
        doc.update(
            state=canary.state.value,
            baseline=canary.baseline,
            candidate=canary.candidate,
            share=canary.policy.share,
            policy=canary.policy.as_json(),
            good_requests=canary.good_requests,
            window=[canary.figures(v).as_json() for v in (canary.candidate, canary.baseline)],
            decision=canary.decision.as_json() if canary.decision else None,
        )
        return doc

    def shares(self) -> list[tuple[str, int, float]]:
        """(model, version, share of unversioned traffic) for every running canary."""
        rows: list[tuple[str, int, float]] = []
        for name, entry in sorted(self._entries.items()):
            if _running(entry):
                assert entry.canary is not None
                share = entry.canary.policy.share
                rows.append((name, entry.canary.candidate, share))
                rows.append((name, entry.canary.baseline, 1.0 - share))
        return rows

    def _apply(self, name: str, entry: _Entry, decision: CanaryDecision) -> None:
        promoted = decision.action is Action.PROMOTE
        entry.pin = decision.candidate if promoted else decision.baseline
        self._save()
        kind = "canary_promoted" if promoted else "canary_rolled_back"
        log = logger.info if promoted else logger.warning
        log(
            "canary for model %s: %s version %d (%s)",
            name,
            "promoted" if promoted else "rolled back",
            decision.candidate,
            decision.reason,
            extra={"model": name, "version": decision.candidate},
        )
        self.events.record(name, decision.candidate, kind, decision.as_json())

    def _end(self, name: str, entry: _Entry, reason: str) -> None:
        """Stop a running canary and pin the baseline."""
        assert entry.canary is not None
        seen = entry.canary.stop()
        entry.pin = entry.canary.baseline
        self._save()
        logger.info("canary for model %s stopped: %s", name, reason, extra={"model": name})
        detail = {
            "reason": reason,
            "candidate": entry.canary.candidate,
            "baseline": entry.canary.baseline,
            **{k: v for k, v in seen.as_json().items() if k != "version"},
            "good_requests": entry.canary.good_requests,
        }
        self.events.record(name, entry.canary.candidate, "canary_stopped", detail)

    def _check_versions(self, name: str) -> bool:
        """Whether the model's entry still applies; stops/drops it when the versions changed.

        Returns False too when the model is not served (the entry waits for it).
        """
        entry = self._entries.get(name)
        if entry is None:
            return False
        try:
            served, _ = self._registry.resolve(name, None)
        except (ModelNotFoundError, ModelNotReadyError):
            return False
        now = tuple(sorted(served.versions))
        if now == entry.versions:
            return True
        reason = f"model now serves versions {list(now)}, not {list(entry.versions)}"
        if _running(entry):
            self._end(name, entry, reason)
        elif entry.pin is not None:
            detail = {"reason": f"pin dropped: {reason}"}
            self.events.record(name, entry.pin, "canary_stopped", detail)
        del self._entries[name]
        self._save()
        return False

    def _save(self) -> None:
        if self._path is None:
            return
        models: dict[str, Any] = {}
        for name, entry in sorted(self._entries.items()):
            item: dict[str, Any] = {"versions": list(entry.versions), "pin": entry.pin}
            canary = entry.canary
            if canary is not None and canary.state is CanaryState.RUNNING:
                item["canary"] = {**canary.policy.as_json(), "baseline": canary.baseline}
            models[name] = item
        data = json.dumps({"schema": _SCHEMA, "models": models}, indent=1, sort_keys=True)
        try:
            atomic_write_bytes(self._path, data.encode() + b"\n")
        except OSError as exc:
            logger.error("cannot write canary state %s: %s", self._path, exc)
            self.events.record(
                "*",
                None,
                CANARY_STATE_WRITE_FAILED,
                {"path": str(self._path), "reason": str(exc), "models": sorted(models)},
            )

    def _load(self) -> dict[str, _Entry]:
        """The saved entries; an unreadable or invalid file is logged and ignored."""
        assert self._path is not None
        try:
            doc = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            return self._corrupt(str(exc))
        try:
            return _entries_from_json(doc)
        except (CanaryPolicyError, KeyError, TypeError, ValueError, AttributeError) as exc:
            return self._corrupt(f"invalid content ({exc})")

    def _corrupt(self, reason: str) -> dict[str, _Entry]:
        """A state file that cannot be used: logged, told as an event, and ignored."""
        logger.error("canary state %s ignored: %s", self._path, reason)
        self.events.record(
            "*", None, CANARY_STATE_CORRUPT, {"path": str(self._path), "reason": reason}
        )
        return {}


def _entries_from_json(doc: Any) -> dict[str, _Entry]:
    if not isinstance(doc, dict) or doc.get("schema") != _SCHEMA:
        raise ValueError("unknown schema")
    entries: dict[str, _Entry] = {}
    for name, item in doc["models"].items():
        versions = tuple(int(v) for v in item["versions"])
        pin = item.get("pin")
        entry = _Entry(versions, None, int(pin) if pin is not None else None)
        saved = item.get("canary")
        if saved is not None:
            saved = dict(saved)
            baseline = int(saved.pop("baseline"))
            entry.canary = Canary(parse_policy(saved), baseline)
            logger.info(
                "canary for model %s resumed (version %d, baseline %d); its counts restart",
                name,
                entry.canary.candidate,
                baseline,
                extra={"model": name},
            )
        entries[str(name)] = entry
    return entries


def _running(entry: _Entry) -> bool:
    return entry.canary is not None and entry.canary.state is CanaryState.RUNNING
