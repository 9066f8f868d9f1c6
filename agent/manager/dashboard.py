"""The fleet dashboard: `edge-agent fleet dashboard --port 9500`.

It subscribes to what every device publishes (`{prefix}/+/status`, `telemetry`, `events`; the
same topics `fleet watch` reads), folds it into a `FleetView`, and serves, read-only:

    GET /                                     the page (agent.manager.dashboard_page)
    GET /fleet/v1/state                       devices, rollouts, events: what the page polls
    GET /fleet/v1/devices/{device}/telemetry  a device's last telemetry message

The page and the state take `page`, `per_page` (50; at most 500), `state` (online, degraded,
offline, unknown) and `q` (a part of the device id): devices come a page at a time, with the
count in each state over the whole fleet (`agent.manager.dashboard_state.FleetView.page`); a
bad value answers 400 with what to fix.

Rollouts come through `RolloutSource`, a two-method interface whose JSON shape is given in
docs/pages.md (`fleet dashboard --rollouts FILE` reads the rollout manager's file); without one
the page says "No rollouts". With a token every route answers only
requests carrying it (`agent.pages.token_middleware`), else 401.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from agent.manager.dashboard_page import render_dashboard
from agent.manager.dashboard_state import LEAVES, DeviceQuery, FleetView
from agent.pages import token_middleware
from agent.wire.mqtt import Message, MqttClient, MqttSettings

__all__ = ["PATHS", "Dashboard", "NoRollouts", "RolloutSource"]

logger = logging.getLogger(__name__)

PATHS = ("/", "/fleet/v1/state", "/fleet/v1/devices/{device}/telemetry")


class RolloutSource(Protocol):
    """Where the dashboard reads rollouts (`agent.manager.rollout_view.StoreRollouts` reads the
    rollout manager's file).

    `rollouts()`: a list of {"id", "model", "version", "state", "reason", "waves": [{"name",
    "state", "devices": {device: job state}, "rollback": {device: state}, "details": {device:
    why}, "gate": {"verdict", "figures": {name: value}, "limits": {name: value}} | None}]}
    (docs/pages.md has every field); `groups()`: each device's groups ({}: as the devices
    report them). Both are called per poll of the page: keep them cheap (one query).
    """

    def rollouts(self) -> list[dict[str, Any]]: ...

    def groups(self) -> dict[str, list[str]]: ...


class NoRollouts:
    """A fleet without a rollout store."""

    def rollouts(self) -> list[dict[str, Any]]:
        return []

    def groups(self) -> dict[str, list[str]]:
        return {}


class Dashboard:
    """The MQTT subscriber and the web app around one `FleetView`.

    Args:
        settings: The broker and this subscriber's client id.
        prefix: The devices' topic prefix.
        rollouts: The rollout store (default: none).
        token: The token every request must carry (None: open; the CLI requires one beyond
            loopback).
        clock: Unix seconds (the "last seen" ages and messages without `ts`).
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        prefix: str = "edge",
        rollouts: RolloutSource | None = None,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.view = FleetView(prefix)
        self._prefix = prefix
        self._rollouts = rollouts or NoRollouts()
        self._token = token
        self._clock = clock
        self.client = MqttClient(settings, on_message=self._on_message)
        self._runner: web.AppRunner | None = None

    def _on_message(self, message: Message) -> None:
        try:
            doc = json.loads(message.payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            logger.debug("not JSON on %s", message.topic)
            return
        if isinstance(doc, dict):
            self.view.apply(message.topic, doc, self._clock())

    def state(self, query: DeviceQuery | None = None) -> dict[str, Any]:
        """The `/fleet/v1/state` document: one page of devices (`query`; None: the first)."""
        doc: dict[str, Any] = {
            "now": self._clock(),
            "broker": self.client.connected,
            "access": "token" if self._token is not None else "open",
            "rollouts": [],
        }
        groups: dict[str, list[str]] = {}
        try:
            doc["rollouts"] = self._rollouts.rollouts()
            groups = self._rollouts.groups()
        except Exception as exc:  # noqa: BLE001 - the store's trouble: shown, devices still served
            logger.warning("rollouts unavailable: %s", exc)
            doc["rollouts_error"] = str(exc)
        found = self.view.page(groups, query or DeviceQuery())
        doc["devices"] = found.rows
        doc.update(found.to_json())
        doc["events"] = self.view.events()
        return doc

    def app(self) -> web.Application:
        app = web.Application(middlewares=[token_middleware(lambda: self._token, PATHS)])
        app.add_routes(
            [
                web.get("/", self._page),
                web.get("/fleet/v1/state", self._state),
                web.get("/fleet/v1/devices/{device}/telemetry", self._telemetry),
            ]
        )
        return app

    async def start(self, host: str, port: int) -> int:
        """Connect (the broker may be away: it retries), subscribe, listen; the bound port."""
        await self.client.start()
        for leaf in LEAVES:
            done = self.client.subscribe(f"{self._prefix}/+/{leaf}")  # renewed on every connect
            done.add_done_callback(lambda f: f.cancelled() or f.exception())  # no broker: fine
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.client.stop()

    async def _page(self, request: web.Request) -> web.Response:
        try:
            query = DeviceQuery.parse(request.query)
        except ValueError as exc:
            return web.Response(text=f"{exc}\n", status=400, content_type="text/plain")
        return web.Response(
            text=render_dashboard(self.state(query)),
            content_type="text/html",
            headers={"Cache-Control": "no-store"},
        )

    async def _state(self, request: web.Request) -> web.Response:
        try:
            query = DeviceQuery.parse(request.query)
        except ValueError as exc:
            return _json({"error": str(exc)}, status=400)
        return _json(self.state(query))

    async def _telemetry(self, request: web.Request) -> web.Response:
        device = request.match_info["device"]
        found = self.view.telemetry(device)
        if found is None:
            return _json({"error": f"no telemetry from device '{device}'"}, status=404)
        return _json(found)


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(doc, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
