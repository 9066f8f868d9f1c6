"""What the fleet dashboard knows: the devices and the events feed, folded from the messages the
devices publish (`status`, `telemetry`, `events`; docs/mqtt.md). Pure: `apply` takes a topic,
its decoded payload and "now" (Unix seconds); nothing here reads a clock or a socket.

A device's figures come from its telemetry: p95 is the worst model version's in the last one;
the error rate is the failures over the requests across the last `RATE_WINDOW` messages (the
counters are cumulative; the first telemetry gives the rate since the agent started; none when
no request came in the window).
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeviceView", "FleetView", "split_topic"]

LEAVES = ("status", "telemetry", "events")
RATE_WINDOW = 30  # telemetry messages: 5 minutes at the default 10 s interval


def split_topic(prefix: str, topic: str) -> tuple[str, str] | None:
    """(device, leaf) of `{prefix}/{device}/{leaf}`, None for any other topic."""
    head, sep, rest = topic.partition("/")
    device, sep2, leaf = rest.partition("/")
    if head != prefix or not sep or not sep2 or not device or leaf not in LEAVES:
        return None
    return device, leaf


@dataclass(slots=True)
class DeviceView:
    """One device as last heard from."""

    device: str
    state: str = "unknown"
    reason: str = ""
    agent_version: str | None = None
    groups: list[str] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)
    last_seen: float | None = None
    telemetry: dict[str, Any] | None = None
    p95_us: float | None = None
    error_rate: float | None = None
    # (requests, failures) of the last telemetry messages: the error rate's window
    _totals: collections.deque[tuple[int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RATE_WINDOW)
    )

    def to_json(self, groups: Sequence[str]) -> dict[str, Any]:
        return {
            "device": self.device,
            "state": self.state,
            "reason": self.reason,
            "agent_version": self.agent_version,
            "groups": list(groups or self.groups),
            "versions": self.versions,
            "p95_us": self.p95_us,
            "error_rate": self.error_rate,
            "last_seen": self.last_seen,
        }


class FleetView:
    """Devices by id and the newest `events_kept` events (newest first)."""

    def __init__(self, prefix: str = "edge", events_kept: int = 50) -> None:
        self.prefix = prefix
        self.devices: dict[str, DeviceView] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=events_kept)

    def apply(self, topic: str, doc: Mapping[str, Any], now: float) -> bool:
        """Fold one message in; False when it is not a device's status, telemetry or event."""
        where = split_topic(self.prefix, topic)
        if where is None or not isinstance(doc, Mapping):
            return False
        device, leaf = where
        view = self.devices.get(device)
        if view is None:
            view = self.devices[device] = DeviceView(device)
        ts = doc.get("ts")
        seen = float(ts) if isinstance(ts, int | float) else now
        if leaf == "status":
            _status(view, doc)
            if view.state != "offline":
                view.last_seen = seen
        elif leaf == "telemetry":
            _telemetry(view, doc)
            view.last_seen = seen
        else:
            self._events.appendleft(
                {
                    "ts": seen,
                    "time": datetime.datetime.fromtimestamp(seen, datetime.UTC).strftime(
                        "%Y-%m-%d %H:%M:%S"
                    ),
                    "device": device,
                    "event": doc.get("event"),
                    "model": doc.get("model"),
                    "version": doc.get("version"),
                    "detail": doc.get("detail", {}),
                }
            )
            view.last_seen = seen
        return True

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def devices_json(self, groups: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
        """Each device; its groups from `groups` (the rollout source), else its own status."""
        return [self.devices[d].to_json(groups.get(d, ())) for d in sorted(self.devices)]

    def telemetry(self, device: str) -> dict[str, Any] | None:
        view = self.devices.get(device)
        return view.telemetry if view is not None else None


def _status(view: DeviceView, doc: Mapping[str, Any]) -> None:
    view.state = str(doc.get("state") or "unknown")
    view.reason = str(doc.get("reason") or "")
    if doc.get("agent_version") is not None:
        view.agent_version = str(doc["agent_version"])
    if isinstance(doc.get("groups"), list):
        view.groups = [str(g) for g in doc["groups"]]
    models = doc.get("models")
    if isinstance(models, list):
        view.versions = {
            str(m.get("name")): [int(v) for v in m.get("versions", []) if isinstance(v, int)]
            for m in models
            if isinstance(m, Mapping)
        }


def _telemetry(view: DeviceView, doc: Mapping[str, Any]) -> None:
    view.telemetry = dict(doc)
    models = [m for m in doc.get("models", []) if isinstance(m, Mapping)]
    p95s = [
        float(p)
        for m in models
        if isinstance(p := (m.get("latency_us") or {}).get("p95"), int | float)
    ]
    view.p95_us = max(p95s) if p95s else None
    requests = sum(int(m.get("requests") or 0) for m in models)
    failures = sum(int(m.get("failures") or 0) for m in models)
    if view._totals and requests < view._totals[-1][0]:  # the agent restarted: so did its counters
        view._totals.clear()
        view._totals.append((0, 0))
    view._totals.append((requests, failures))
    first, last = view._totals[0], view._totals[-1]
    asked, failed = last[0] - first[0], last[1] - first[1]
    if len(view._totals) == 1:  # the first telemetry: since the agent started
        asked, failed = requests, failures
    view.error_rate = round(failed / asked, 4) if asked > 0 else None
