"""The document behind the device status page (`agent.api.status_page`): `DeviceStatus`.

Cheap per request: the figures (rates, quantiles, memory, cache disk, sync) come from the last
periodic sample, taken every `interval_s` in a worker thread by the same `TelemetrySampler` the
fleet link uses, and kept in a small ring (`History`) for the sparklines. A request only adds
what is cheap to read now: the model index (so a hot swap shows at the next poll), the
canaries and the last events (an `EventSink` keeping the newest `EVENTS_KEPT`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.config.schema import ServerConfig
from agent.errors import AgentError
from agent.fleet.telemetry import TelemetrySampler
from agent.pages import is_loopback_host
from agent.serving.dataplane import DataPlane

__all__ = ["EVENTS_KEPT", "DeviceStatus", "History", "RecentEvents", "status_token"]

logger = logging.getLogger(__name__)

EVENTS_KEPT = 20
SAMPLES_KEPT = 60  # with the default 5 s interval: the last five minutes


class History:
    """The last `size` samples of each model version's rate and quantiles (pure)."""

    def __init__(self, size: int = SAMPLES_KEPT) -> None:
        self._samples: collections.deque[tuple[float, dict[str, dict[str, Any]]]] = (
            collections.deque(maxlen=size)
        )

    def add(self, ts: float, models: list[dict[str, Any]]) -> None:
        """One telemetry sample's `models` list (`agent.fleet.telemetry`), taken at `ts`."""
        point = {}
        for m in models:
            lat = m.get("latency_us", {})
            point[f"{m['model']}:{m['version']}"] = {
                "ips": m.get("inferences_per_s"),
                "p50_us": lat.get("p50"),
                "p95_us": lat.get("p95"),
                "p99_us": lat.get("p99"),
            }
        self._samples.append((ts, point))

    def series(self) -> dict[str, list[dict[str, Any]]]:
        """Per "model:version", one entry per sample (None figures where it was not served)."""
        keys = {key for _, point in self._samples for key in point}
        empty = {"ips": None, "p50_us": None, "p95_us": None, "p99_us": None}
        return {
            key: [{"ts": round(ts, 1), **point.get(key, empty)} for ts, point in self._samples]
            for key in sorted(keys)
        }


class RecentEvents:
    """An `EventSink` keeping the newest events for the page (thread-safe)."""

    def __init__(self, size: int = EVENTS_KEPT, clock: Callable[[], float] = time.time) -> None:
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._lock = threading.Lock()
        self._clock = clock

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        stamp = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        entry = {
            "time": stamp.strftime("%Y-%m-%d %H:%M:%S"),
            "event": kind,
            "model": model,
            "version": version,
            "detail": json.loads(json.dumps(dict(detail), default=str)),  # JSON-safe
        }
        with self._lock:
            self._events.appendleft(entry)

    def newest(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)


class DeviceStatus:
    """The status page's source: `start()` the sampling task, `snapshot()` per request."""

    def __init__(
        self,
        dataplane: DataPlane,
        sampler: TelemetrySampler,
        *,
        access: str,
        interval_s: float = 5.0,
    ) -> None:
        self.events = RecentEvents()
        self._dataplane = dataplane
        self._sampler = sampler
        self._access = access
        self._interval_s = interval_s
        self._history = History()
        self._last: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take a first sample, then one every interval until `stop`."""
        await self._sample()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self._sample()

    async def _sample(self) -> None:
        try:
            body, _ = await asyncio.to_thread(self._sampler.sample, time.monotonic())
        except Exception:  # a probe failed: the page keeps its last figures
            logger.exception("status sample failed")
            return
        self._history.add(time.time(), body.get("models", []))
        self._last = body

    def snapshot(self) -> dict[str, Any]:
        """The `/v2/status` document (see docs/pages.md)."""
        dp = self._dataplane
        last = self._last
        models = dp.repository_index(detailed=True)
        fallbacks = dp.cpu_fallbacks()
        for row in models:  # flagged apart from the reason, so the page can mark the row
            note = fallbacks.get((row["name"], int(row.get("version") or -1)))
            if note and row.get("state") == "READY":
                row["cpu_fallback"] = note
        return {
            "agent_version": dp.server_metadata()["version"],
            "ready": dp.server_ready(),
            "access": self._access,
            "models": models,
            "stats": last.get("models", []),
            "history": self._history.series(),
            "interval_s": self._interval_s,
            "memory": last.get("memory"),
            "cache_disk_bytes": last.get("cache_disk_bytes"),
            "sync": last.get("sync"),
            "gpu": last.get("gpu", []),
            "canary": self._canaries(sorted({str(m["name"]) for m in models})),
            "events": self.events.newest(),
        }

    def _canaries(self, names: list[str]) -> list[dict[str, Any]]:
        found = []
        for served in names:
            try:
                doc = self._dataplane.canary.status(served)
            except AgentError:
                continue
            if doc.get("state") != "NONE" or doc.get("pinned_version") is not None:
                found.append(doc)
        return found


def status_token(server: ServerConfig) -> str | None:
    """The token the status page needs: the configured one; none on loopback without one; an
    unguessable one beyond loopback without one (the page is then closed to everybody)."""
    if server.status_token:
        return server.status_token
    if is_loopback_host(server.host):
        return None
    logger.warning(
        "status page closed: server.host is beyond loopback and server.status_token is not set"
    )
    return secrets.token_urlsafe(32)
