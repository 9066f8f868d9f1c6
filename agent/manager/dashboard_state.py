"""What the fleet dashboard knows: the devices and the events feed, folded from the messages the
devices publish (`status`, `telemetry`, `events`; docs/mqtt.md). Pure: `apply` takes a topic,
its decoded payload and "now" (Unix seconds); nothing here reads a clock or a socket.

A device's figures come from its telemetry: p95 is the worst model version's in the last one;
the error rate is the failures over the requests across the last `RATE_WINDOW` messages (the
counters are cumulative; the first telemetry gives the rate since the agent started; none when
no request came in the window).

The page shows devices a page at a time (`FleetView.page`: sorted by id, filtered by state and
by a part of the id, `PER_PAGE` to a page, at most `MAX_PER_PAGE`), with the count of devices
in each state over the whole fleet: a 10,000-device fleet is 200 pages of 50 rows, not one
table of 10,000 (bench/fleet10k.md has the first paint of both).
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_PER_PAGE",
    "PER_PAGE",
    "STATES",
    "DevicePage",
    "DeviceQuery",
    "DeviceView",
    "FleetView",
    "split_topic",
]

LEAVES = ("status", "telemetry", "events")
RATE_WINDOW = 30  # telemetry messages: 5 minutes at the default 10 s interval
PER_PAGE = 50
MAX_PER_PAGE = 500
STATES = ("online", "degraded", "offline", "unknown")
_QUERY_CHARS = 128


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


@dataclass(frozen=True, slots=True)
class DeviceQuery:
    """Which devices a page shows: `page` (from 1) of `per_page`, only `state` (None: all) and
    only ids containing `search` (case-insensitive)."""

    page: int = 1
    per_page: int = PER_PAGE
    state: str | None = None
    search: str = ""

    def __post_init__(self) -> None:
        if self.page < 1:
            raise ValueError("page must be an integer >= 1")
        if not 1 <= self.per_page <= MAX_PER_PAGE:
            raise ValueError(f"per_page must be an integer in 1..{MAX_PER_PAGE}")
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        if len(self.search) > _QUERY_CHARS:
            raise ValueError(f"q must be at most {_QUERY_CHARS} characters")

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> DeviceQuery:
        """From a request's query string (`page`, `per_page`, `state`, `q`).

        Raises:
            ValueError: a parameter out of range, with what to fix.
        """
        numbers = {}
        for key, default in (("page", 1), ("per_page", PER_PAGE)):
            text = params.get(key, "").strip()
            if not text:
                numbers[key] = default
            elif text.isdigit() and len(text) <= 9:
                numbers[key] = int(text)
            else:
                raise ValueError(f"{key} must be an integer, got {text[:20]!r}")
        state = params.get("state", "").strip() or None
        return cls(numbers["page"], numbers["per_page"], state, params.get("q", "").strip())


@dataclass(frozen=True, slots=True)
class DevicePage:
    """One page of devices and where it stands in the fleet."""

    rows: list[dict[str, Any]]
    query: DeviceQuery
    page: int  # the page shown (the last one when the query asked beyond it)
    pages: int
    matching: int  # devices the filter keeps
    total: int
    counts: dict[str, int]  # devices per state, over the whole fleet

    def to_json(self) -> dict[str, Any]:
        """The paging fields of `/fleet/v1/state` (the rows go under `devices`)."""
        return {
            "page": self.page,
            "pages": self.pages,
            "per_page": self.query.per_page,
            "state_filter": self.query.state,
            "q": self.query.search,
            "devices_matching": self.matching,
            "devices_total": self.total,
            "counts": self.counts,
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

    def page(self, groups: Mapping[str, Sequence[str]], query: DeviceQuery) -> DevicePage:
        """The devices `query` asks for (rows built for that page only) and the fleet's counts.

        Args:
            groups: Each device's groups from the rollout source ({}: as the devices say).
            query: The page, its size and the filters.
        """
        counts = dict.fromkeys(STATES, 0)
        for view in self.devices.values():
            counts[_state_of(view)] += 1
        needle = query.search.lower()
        kept = sorted(
            d
            for d, v in self.devices.items()
            if (query.state is None or _state_of(v) == query.state) and needle in d.lower()
        )
        pages = max(1, -(-len(kept) // query.per_page))
        page = min(query.page, pages)
        start = (page - 1) * query.per_page
        rows = [
            self.devices[d].to_json(groups.get(d, ())) for d in kept[start : start + query.per_page]
        ]
        return DevicePage(rows, query, page, pages, len(kept), len(self.devices), counts)

    def telemetry(self, device: str) -> dict[str, Any] | None:
        view = self.devices.get(device)
        return view.telemetry if view is not None else None


def _state_of(view: DeviceView) -> str:
    return view.state if view.state in STATES else "unknown"


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
