"""The device status page: `GET /` (HTML) and `GET /v2/status` (the JSON it polls).

The page is rendered here from the same document `/v2/status` returns, so it paints complete in
one response; `agent/static/status.js` then polls `/v2/status` and redraws it in place (a hot
swap shows without a reload). Read-only: the page has no form and no button that changes the
device. Both routes sit behind the status token (the HTTP policy, `agent.api.http.policy`):
the daemon passes the configured `server.status_token`, none on loopback without one, and an
unguessable one beyond loopback without one (the page is then closed to everybody).

The document comes from a `StatusSource` (built in `agent.runtime.status`), so this module
only renders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web

from agent.pages import esc, fmt_bytes, fmt_num, page, sparkline, table
from agent.serving.dataplane import DataPlane

__all__ = [
    "STATUS_PATHS",
    "BasicStatus",
    "STATUS_SOURCE",
    "StatusSource",
    "render_status",
    "status_routes",
]

POLL_MS = 2000
STATUS_PATHS = ("/", "/v2/status")
# A version running without the accelerators its config asks for (the same in status.js).
FALLBACK_FLAG = ' <strong class="state-degraded">CPU fallback</strong>'


class StatusSource(Protocol):
    """The device's state as the status page shows it (see `agent.runtime.status`)."""

    def snapshot(self) -> dict[str, Any]: ...


STATUS_SOURCE = web.AppKey("status_source", StatusSource)


class BasicStatus:
    """The document from the data plane alone (an app built without the daemon's
    `agent.runtime.status.DeviceStatus`)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    def snapshot(self) -> dict[str, Any]:
        return {
            "agent_version": self._dataplane.server_metadata()["version"],
            "ready": self._dataplane.server_ready(),
            "models": self._dataplane.repository_index(detailed=True),
        }


def status_routes() -> list[web.RouteDef]:
    return [web.get("/", _page), web.get("/v2/status", _status)]


async def _status(request: web.Request) -> web.Response:
    doc = request.app[STATUS_SOURCE].snapshot()
    return web.Response(
        body=json.dumps(doc, separators=(",", ":")),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def _page(request: web.Request) -> web.Response:
    doc = request.app[STATUS_SOURCE].snapshot()
    return web.Response(
        text=render_status(doc),
        content_type="text/html",
        headers={"Cache-Control": "no-store"},
    )


def render_status(doc: Mapping[str, Any]) -> str:
    """The whole page for a `/v2/status` document."""
    body = (
        f"<header><h1>edge-agent <small>{esc(doc.get('agent_version'))}</small></h1>"
        f'<p id="health" class="{"ok" if doc.get("ready") else "bad"}">'
        f"{'Ready' if doc.get('ready') else 'Not ready'}</p>"
        f'<p id="access">{esc(_access_note(doc.get("access")))}</p></header>'
        '<main id="main">'
        + _section("models", "Models", _models_table(doc.get("models", [])))
        + _section("serving", "Serving (last minutes)", _serving_table(doc))
        + _section("resources", "Memory, cache and sync", _resources(doc))
        + _section("canary", "Canary", _canary_table(doc.get("canary", [])))
        + _section("events", "Last events", _events_table(doc.get("events", [])))
        + '</main><footer><p>Read-only. Updated every 2 s from <a href="v2/status">'
        'v2/status</a>. <span id="updated" role="status"></span></p></footer>'
    )
    return page("edge-agent status", body, script="status.js", data_url="v2/status",
                interval_ms=POLL_MS)  # fmt: skip


def _access_note(access: object) -> str:
    if access == "token":
        return "Token required: this page answers only requests carrying the status token."
    return "Open on loopback only: no token (set server.status_token to open it beyond)."


def _section(key: str, title: str, inner: str) -> str:
    return f'<section aria-labelledby="h-{key}"><h2 id="h-{key}">{title}</h2>{inner}</section>'


def _models_table(models: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr><th scope="row">{esc(m.get("name"))}</th><td>{esc(m.get("version"))}</td>'
        f'<td class="state-{esc(m.get("state", "")).lower()}">{esc(m.get("state"))}'
        f"{FALLBACK_FLAG if m.get('cpu_fallback') else ''}</td>"
        f"<td>{esc(m.get('reason') or None)}</td></tr>"
        for m in models
    ]
    return table(
        "Models and versions", ("Model", "Version", "State", "Reason"), rows, "models-body"
    )


def _serving_table(doc: Mapping[str, Any]) -> str:
    history = doc.get("history", {})
    rows = []
    for m in doc.get("stats", []):
        key = f"{m.get('model')}:{m.get('version')}"
        lat = m.get("latency_us", {})
        p95s = [s.get("p95_us") for s in history.get(key, [])]
        rows.append(
            f'<tr><th scope="row">{esc(m.get("model"))}</th><td>{esc(m.get("version"))}</td>'
            f"<td>{fmt_num(m.get('inferences_per_s'), 2)}</td>"
            + "".join(f"<td>{fmt_num(_ms(lat.get(q)), 2)}</td>" for q in ("p50", "p95", "p99"))
            + f"<td>{sparkline(p95s)}</td><td>{esc(m.get('pending'))}</td>"
            f"<td>{fmt_num(m.get('mean_batch_size'), 2)}</td>"
            f"<td>{esc(m.get('requests'))}</td><td>{esc(m.get('failures'))}</td></tr>"
        )
    head = ("Model", "Version", "Inferences/s", "p50 ms", "p95 ms", "p99 ms", "p95 trend",
            "Queued", "Batch size", "Requests", "Failures")  # fmt: skip
    return table("Throughput, latency and queue by version", head, rows, "serving-body")


def _ms(us: object) -> float | None:
    return float(us) / 1000 if isinstance(us, int | float) else None


def _resources(doc: Mapping[str, Any]) -> str:
    memory = doc.get("memory") or {}
    sync = doc.get("sync")
    if sync is None:
        sync_state, sync_error = "not configured", None
    else:
        sync_state = "failing" if sync.get("failing") else "ok"
        sync_error = sync.get("failing") or (
            "; ".join(f"{k}: {v}" for k, v in (sync.get("model_errors") or {}).items()) or None
        )
    rows = [
        ("Memory budget", fmt_bytes(memory.get("budget_bytes"))),
        ("Memory used", fmt_bytes(memory.get("used_bytes"))),
        ("Memory in flight", inflight_line(memory)),
        ("Cache on disk", fmt_bytes(doc.get("cache_disk_bytes"))),
        ("Sync", esc(sync_state)),
        ("Sync last error", esc(sync_error)),
        *((f"GPU {esc(g.get('index'))}", esc(gpu_line(g))) for g in doc.get("gpu") or []),
    ]
    cells = "".join(f'<tr><th scope="row">{k}</th><td>{v}</td></tr>' for k, v in rows)
    return (
        '<div class="scroll"><table><caption>Resources</caption><tbody id="resources-body">'
        f"{cells}</tbody></table></div>"
    )


def inflight_line(memory: Mapping[str, Any]) -> str:
    """The pool for requests in flight in words (the same as status.js's row)."""
    if memory.get("inflight_capacity_bytes") is None:
        return fmt_bytes(None)
    return (
        f"{fmt_bytes(memory.get('inflight_bytes'))} of "
        f"{fmt_bytes(memory.get('inflight_capacity_bytes'))} "
        f"(peak {fmt_bytes(memory.get('inflight_peak_bytes'))}, "
        f"{esc(memory.get('inflight_refused'))} refused)"
    )


def gpu_line(gpu: Mapping[str, Any]) -> str:
    """One GPU's reading in words (the same as `gpuLine` in status.js)."""
    parts = []
    if gpu.get("util_percent") is not None:
        parts.append(f"{gpu['util_percent']} % busy")
    if gpu.get("memory_used_bytes") is not None:
        parts.append(
            f"{fmt_bytes(gpu['memory_used_bytes'])} of {fmt_bytes(gpu.get('memory_total_bytes'))}"
        )
    if gpu.get("power_w") is not None:
        parts.append(f"{fmt_num(gpu['power_w'])} W")
    return ", ".join(parts) or "no figures"


def _canary_table(canaries: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr><th scope="row">{esc(c.get("model"))}</th><td>{esc(c.get("state"))}</td>'
        f"<td>{esc(c.get('baseline'))}</td><td>{esc(c.get('candidate'))}</td>"
        f"<td>{esc(c.get('share'))}</td><td>{esc(c.get('pinned_version'))}</td></tr>"
        for c in canaries
    ]
    head = ("Model", "State", "Baseline", "Candidate", "Share", "Pinned")
    return table("Canaries and pins", head, rows, "canary-body")


def _events_table(events: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr><td><time datetime="{esc(e.get("time"))}">{esc(e.get("time"))}</time></td>'
        f"<td>{esc(e.get('event'))}</td><td>{esc(e.get('model'))}</td>"
        f"<td>{esc(e.get('version'))}</td>"
        f"<td><code>{esc(json.dumps(e.get('detail', {}), sort_keys=True))}</code></td></tr>"
        for e in events
    ]
    head = ("Time (UTC)", "Event", "Model", "Version", "Detail")
    return table("Most recent first", head, rows, "events-body")
