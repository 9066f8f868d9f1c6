"""What the two read-only pages share: the device status page (`agent.api.status_page`) and the
fleet dashboard (`agent.manager.dashboard`).

* The token check: a page with a token answers only requests carrying it (`Authorization:
  Bearer <token>` or `?token=<token>`), compared in constant time; any other request gets 401
  with a body that says nothing about the page, the token or the device.
* The static assets (`agent/static/`, package data), inlined into each page so that one
  response paints it: no CDN, no second request, nothing to build.
* Whether a bind address stays on this machine (a page served beyond it needs a token).
* Small HTML helpers: escaping, byte and number formats, the SVG sparkline, tables.

Pure apart from reading the packaged assets once.
"""

from __future__ import annotations

import functools
import hmac
import html
import importlib.resources
import ipaddress
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "UNAUTHORIZED",
    "asset",
    "esc",
    "fmt_bytes",
    "fmt_num",
    "is_loopback_host",
    "page",
    "request_token",
    "sparkline",
    "table",
    "token_middleware",
    "token_matches",
]

# The whole answer to a request without the right token: nothing about what is behind it.
UNAUTHORIZED = b'{"error":"unauthorized"}'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@functools.cache
def asset(name: str) -> str:
    """A file of `agent/static/` (read once)."""
    return (importlib.resources.files("agent") / "static" / name).read_text(encoding="utf-8")


def request_token(request: web.Request) -> str | None:
    """The token a request carries: `Authorization: Bearer <t>`, else `?token=<t>`."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query.get("token")


def is_loopback_host(host: str) -> bool:
    """Whether a bind address stays on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost, or "" (every address)


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (the time taken does not depend on how much of it matched)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def token_middleware(expected: Callable[[], str | None], paths: Iterable[str]) -> Middleware:
    """Guard the routes whose canonical path is in `paths`.

    Args:
        expected: The token now in force, read per request (None: the page is open).
        paths: Canonical route paths (`/fleet/v1/devices/{device}/telemetry`) to guard.
    """
    guarded = frozenset(paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in guarded:
            token = expected()
            if token is not None and not token_matches(request_token(request), token):
                return unauthorized()
        return await handler(request)

    return middleware


def unauthorized() -> web.Response:
    return web.Response(
        status=401,
        body=UNAUTHORIZED,
        content_type="application/json",
        headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"},
    )


def esc(value: object) -> str:
    """HTML-escaped text of a value (None: an en dash)."""
    return "\u2013" if value is None else html.escape(str(value), quote=True)


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A figure for a table cell (None or NaN: an en dash)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    return f"{value:,.{digits}f}"


def fmt_bytes(value: float | None) -> str:
    """Bytes in binary units (MiB, GiB) for a table cell."""
    if value is None:
        return "\u2013"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"  # pragma: no cover - the loop returns


def sparkline(values: Sequence[float | None], width: int = 120, height: int = 24) -> str:
    """An inline SVG polyline of `values` (gaps for None), scaled to its own maximum.

    The same drawing as `sparkline()` in `agent/static/pages.js`, which redraws it on each poll.
    """
    points = [(i, v) for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    top = max((v for _, v in points), default=0.0) or 1.0
    step = width / max(1, len(values) - 1)
    coords = " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in points
    )
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-hidden="true"><polyline points="{coords}"/></svg>'
    )


def table(caption: str, head: Sequence[str], rows: Sequence[str], tbody_id: str) -> str:
    """A captioned table with a header row; `rows` are ready `<tr>` markup ("none" when empty).

    `tbody_id` names the body the page's script refills on each poll.
    """
    cols = "".join(f'<th scope="col">{h}</th>' for h in head)
    empty = f'<tr><td colspan="{len(head)}">none</td></tr>'
    return (
        f'<div class="scroll"><table><caption>{caption}</caption><thead><tr>{cols}</tr></thead>'
        f'<tbody id="{tbody_id}">{"".join(rows) or empty}</tbody></table></div>'
    )


def page(title: str, body: str, *, script: str, data_url: str, interval_ms: int) -> str:
    """A whole page: the shared style and script inlined, then the page's own script.

    Args:
        title: The page title (escaped here).
        body: The server-rendered contents of `<main>` (escaped by the caller).
        script: The page's own script (a file of `agent/static/`).
        data_url: The JSON the script polls.
        interval_ms: How often it polls.
    """
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{asset('pages.css')}</style></head>"
        f'<body data-url="{esc(data_url)}" data-interval="{interval_ms}">'
        f'<a class="skip" href="#main">Skip to content</a>{body}'
        f"<script>{asset('pages.js')}</script><script>{asset(script)}</script></body></html>"
    )
