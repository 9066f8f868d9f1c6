"""The fleet dashboard's HTML, rendered from the document `GET /fleet/v1/state` returns (see
`agent.manager.dashboard`); `agent/static/dashboard.js` polls that document and redraws the same
cells. Read-only: the only form finds devices (a page of them, by state or a part of the id);
nothing here changes a device or a rollout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent.manager.dashboard_state import STATES
from agent.pages import esc, fmt_num, page, table

__all__ = ["POLL_MS", "ago", "pager_text", "render_dashboard", "summary", "wave_devices"]

POLL_MS = 2000
DASH = "\u2013"
DEVICE_HEAD = ("Device", "State", "Groups", "Versions", "p95 ms", "Error rate", "Last seen")
EVENT_HEAD = ("Time (UTC)", "Device", "Event", "Model", "Version", "Detail")


def ago(ts: float | None, now: float) -> str:
    """'12 s ago' (None: an en dash)."""
    if ts is None:
        return DASH
    seconds = max(0, int(now - ts))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def summary(state: Mapping[str, Any]) -> str:
    """'9,998 of 10,000 devices online' (degraded ones serve: they count as online)."""
    counts = state.get("counts") or {}
    devices = state.get("devices", [])
    total = state.get("devices_total", len(devices))
    online = (
        int(counts.get("online", 0)) + int(counts.get("degraded", 0))
        if counts
        else sum(1 for d in devices if d.get("state") in ("online", "degraded"))
    )
    return f"{online:,} of {total:,} devices online"


def pager_text(state: Mapping[str, Any]) -> str:
    """'Page 3 of 200 (10,000 devices)' or, filtered, '... (12 of 10,000 devices)'."""
    matching = int(state.get("devices_matching", len(state.get("devices", []))))
    total = int(state.get("devices_total", matching))
    shown = f"{matching:,} devices" if matching == total else f"{matching:,} of {total:,} devices"
    return f"Page {state.get('page', 1)} of {state.get('pages', 1)} ({shown})"


def _filter_form(state: Mapping[str, Any]) -> str:
    chosen = state.get("state_filter") or ""
    counts = state.get("counts") or {}
    options = '<option value="">all states</option>' + "".join(
        f'<option value="{s}"{" selected" if s == chosen else ""}>{s} '
        f"({int(counts.get(s, 0)):,})</option>"
        for s in STATES
    )
    page, pages = int(state.get("page", 1)), int(state.get("pages", 1))
    return (
        '<form id="device-filter" role="search" method="get" action="">'
        '<label for="device-q">Device id contains</label> '
        '<input id="device-q" name="q" type="search" maxlength="128" '
        f'value="{esc(state.get("q") or "")}"> '
        '<label for="device-state">State</label> '
        f'<select id="device-state" name="state">{options}</select> '
        '<button type="submit">Show</button></form>'
        '<nav aria-label="Device pages" id="device-pager"><p>'
        f'<button type="button" id="page-prev"{" disabled" if page <= 1 else ""}>Previous</button> '
        f'<span id="page-of" aria-live="polite">{esc(pager_text(state))}</span> '
        f'<button type="button" id="page-next"{" disabled" if page >= pages else ""}>Next</button>'
        "</p></nav>"
    )


def render_dashboard(state: Mapping[str, Any]) -> str:
    """The whole page for a `/fleet/v1/state` document (its page of devices)."""
    now = float(state.get("now", 0.0))
    devices = state.get("devices", [])
    access = (
        "Token required: this page answers only requests carrying the dashboard token."
        if state.get("access") == "token"
        else "Open on loopback only: no token."
    )
    body = (
        f'<header><h1>edge-agent fleet</h1><p id="summary">{esc(summary(state))}</p>'
        f'<p id="broker" class="{"ok" if state.get("broker") else "bad"}">'
        f"{'Broker connected' if state.get('broker') else 'Broker not connected'}</p>"
        f'<p id="access">{esc(access)}</p></header><main id="main">'
        '<section aria-labelledby="h-devices"><h2 id="h-devices">Devices</h2>'
        + _filter_form(state)
        + table(
            "Select a device to open its last telemetry",
            DEVICE_HEAD,
            [_device_row(d, now) for d in devices],
            "devices-body",
        )
        + '</section><section id="telemetry" aria-labelledby="h-telemetry" aria-live="polite">'
        '<h2 id="h-telemetry">Last telemetry <span id="telemetry-device"></span></h2>'
        '<pre id="telemetry-json" tabindex="-1">Select a device above.</pre></section>'
        '<section aria-labelledby="h-rollouts"><h2 id="h-rollouts">Rollouts</h2>'
        f'<div id="rollouts">{render_rollouts(state.get("rollouts", []), state)}</div></section>'
        '<section aria-labelledby="h-events"><h2 id="h-events">Events</h2>'
        + table(
            "Most recent first",
            EVENT_HEAD,
            [_event_row(e) for e in state.get("events", [])],
            "events-body",
        )
        + "</section></main><footer><p>Read-only: actions stay on the CLI (edge-agent fleet "
        'send). Updated every 2 s. <span id="updated" role="status"></span></p></footer>'
    )
    return page("edge-agent fleet", body, script="dashboard.js", data_url="fleet/v1/state",
                interval_ms=POLL_MS)  # fmt: skip


def _device_row(d: Mapping[str, Any], now: float) -> str:
    name = esc(d.get("device"))
    versions = ", ".join(
        f"{esc(m)}: {', '.join(str(v) for v in vs)}" for m, vs in (d.get("versions") or {}).items()
    )
    p95 = d.get("p95_us")
    rate = d.get("error_rate")
    return (
        f'<tr><th scope="row"><a class="device" href="fleet/v1/devices/{name}/telemetry" '
        f'data-device="{name}" aria-controls="telemetry">{name}</a></th>'
        f'<td class="state-{esc(d.get("state"))}">{esc(d.get("state"))}'
        f"{' (' + esc(d.get('reason')) + ')' if d.get('reason') else ''}</td>"
        f"<td>{esc(', '.join(d.get('groups') or []) or None)}</td><td>{versions or DASH}</td>"
        f"<td>{fmt_num(p95 / 1000 if p95 is not None else None, 2)}</td>"
        f"<td>{_percent(rate)}</td>"
        f"<td>{ago(d.get('last_seen'), now)}</td></tr>"
    )


def _percent(rate: float | None) -> str:
    return DASH if rate is None else f"{fmt_num(rate * 100, 2)} %"


def _event_row(e: Mapping[str, Any]) -> str:
    return (
        f"<tr><td>{esc(e.get('time'))}</td><td>{esc(e.get('device'))}</td>"
        f"<td>{esc(e.get('event'))}</td><td>{esc(e.get('model'))}</td>"
        f"<td>{esc(e.get('version'))}</td>"
        f"<td><code>{esc(json.dumps(e.get('detail', {}), sort_keys=True))}</code></td></tr>"
    )


def render_rollouts(rollouts: Sequence[Mapping[str, Any]], state: Mapping[str, Any]) -> str:
    """Each rollout: a heading and its waves' table (progress per device, gate vs limits)."""
    if state.get("rollouts_error"):
        return f'<p class="bad">Rollouts unavailable: {esc(state["rollouts_error"])}</p>'
    if not rollouts:
        return "<p>No rollouts.</p>"
    parts = []
    for r in rollouts:
        rid = esc(r.get("id"))
        head = ("Wave", "State", "Devices", "Gate: figures against limits", "Verdict")
        rows = [_wave_row(w) for w in r.get("waves", [])]
        parts.append(
            f'<article class="rollout" aria-labelledby="r-{rid}"><h3 id="r-{rid}">{rid}: '
            f"{esc(r.get('model'))} v{esc(r.get('version'))} "
            f'<span class="state-{esc(r.get("state"))}">{esc(r.get("state"))}</span>'
            f"{' (' + esc(r.get('reason')) + ')' if r.get('reason') else ''}</h3>"
            + table(f"Waves of {rid}", head, rows, f"waves-{rid}")
            + "</article>"
        )
    return "".join(parts)


def _title(detail: Any) -> str:
    return f' title="{esc(detail)}"' if detail else ""


def _undo(rollback: Any) -> str:
    """A device's rollback, after its job state."""
    return f', <span class="state-{esc(rollback)}">{esc(rollback)}</span>' if rollback else ""


def wave_devices(w: Mapping[str, Any]) -> str:
    """A wave's devices: each one, or for a large wave the count in each state, then the
    devices worth a look and how many more there are."""
    details, rollback = w.get("details") or {}, w.get("rollback") or {}
    listed = " ".join(
        f'<span class="state-{esc(s)}"{_title(details.get(d))}>{esc(d)}: {esc(s)}'
        f"{_undo(rollback.get(d))}</span>"
        for d, s in (w.get("devices") or {}).items()
    )
    more = int(w.get("more") or 0)
    if not more:
        return listed
    counts = {**(w.get("counts") or {}), **(w.get("rollback_counts") or {})}
    tally = ", ".join(
        f'<span class="state-{esc(s)}">{esc(s)} {int(n):,}</span>' for s, n in counts.items()
    )
    rest = f"{listed}; " if listed else ""
    return f"{tally}; {rest}{more:,} more of {int(w.get('size') or 0):,} not listed"


def _wave_row(w: Mapping[str, Any]) -> str:
    devices = wave_devices(w)
    gate = w.get("gate") or {}
    figures, limits = gate.get("figures") or {}, gate.get("limits") or {}
    checks = "; ".join(
        f"{esc(k)} {esc(figures.get(k))} / {esc(limits.get(k))}"
        for k in sorted(set(figures) | set(limits))
    )
    verdict = gate.get("verdict")
    return (
        f'<tr><th scope="row">{esc(w.get("name"))}</th>'
        f'<td class="state-{esc(w.get("state"))}">{esc(w.get("state"))}</td>'
        f"<td>{devices or DASH}</td><td>{checks or DASH}</td>"
        f'<td class="state-{esc(verdict)}">{esc(verdict)}</td></tr>'
    )
