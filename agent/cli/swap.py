"""`edge-agent activate|rollback|clear-rejected MODEL`: ask a running agent over its HTTP API.

The hot swap itself happens in the agent (`POST /v2/repository/models/...`); this front door
sends the request, with the headers of a restricted API group and client TLS where needed, and
prints the agent's answer or its `{"error": ...}` message.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent.cli.exit_codes import EXIT_CONFIG, EXIT_LOAD

__all__ = ["VERBS", "add_commands", "run"]

VERBS = ("activate", "rollback", "clear-rejected")


def add_commands(commands: Any) -> None:
    """Add `activate`, `rollback` and `clear-rejected` to the sub-command parsers."""
    for verb, text in (
        ("activate", "serve a cached version on a running agent (hot swap)"),
        ("rollback", "go back a version on a running agent (hot swap)"),
        ("clear-rejected", "let a running agent's sync activate rejected versions again"),
    ):
        cmd = commands.add_parser(verb, help=text)
        cmd.add_argument("model")
        if verb == "activate":
            cmd.add_argument("version", type=int)
        elif verb == "rollback":
            cmd.add_argument("--to", type=int, dest="version", help="default: the previous one")
        else:
            cmd.add_argument("--version", type=int, help="default: every rejected version")
        cmd.add_argument("--url", default="http://127.0.0.1:8000", help="the agent's HTTP address")
        cmd.add_argument(
            "--header",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a header to send, e.g. a restricted API group's key (repeatable)",
        )
        cmd.add_argument("--cacert", type=Path, help="https: the CA that signed the agent")
        cmd.add_argument("--cert", type=Path, help="https: client certificate (mutual TLS)")
        cmd.add_argument("--key", type=Path, help="https: the client certificate's key")


def run(args: argparse.Namespace) -> int:
    """`edge-agent activate|rollback|clear-rejected MODEL`: ask the running agent."""
    model = urllib.parse.quote(args.model, safe="")
    if args.command == "activate":
        path = f"/v2/repository/models/{model}/versions/{args.version}/activate"
        body = b"{}"
    else:
        verb = "rollback" if args.command == "rollback" else "clear-rejected"
        path = f"/v2/repository/models/{model}/{verb}"
        body = json.dumps({"version": args.version} if args.version else {}).encode()
    if not args.url.startswith(("http://", "https://")):
        print("edge-agent: error: --url must start with http:// or https://", file=sys.stderr)
        return EXIT_CONFIG
    headers: dict[str, str] = {}
    for pair in args.header:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            print(f"edge-agent: error: --header must be KEY=VALUE, got {key!r}", file=sys.stderr)
            return EXIT_CONFIG
        headers[key.strip()] = value
    try:
        context = _client_tls(args)
    except (OSError, ssl.SSLError) as exc:
        print(f"edge-agent: error: TLS files: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    url = args.url.rstrip("/") + path
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=600, context=context) as resp:  # noqa: S310
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            message = err.reason
        print(f"edge-agent: error: {message}", file=sys.stderr)
        return EXIT_LOAD
    except OSError as exc:
        print(f"edge-agent: error: cannot reach the agent at {args.url}: {exc}", file=sys.stderr)
        return EXIT_LOAD
    if args.command == "clear-rejected":
        cleared = ", ".join(map(str, doc["cleared"]))
        print(
            f"{doc['model']}: "
            + (f"version(s) {cleared} no longer rejected" if cleared else "no rejected version")
        )
        return 0
    print(f"{doc['model']} now serves version {doc['version']}")
    return 0


def _client_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context of `activate`/`rollback`/`clear-rejected` over https (None: defaults)."""
    if args.cacert is None and args.cert is None:
        return None
    context = ssl.create_default_context(cafile=args.cacert)
    if args.cert is not None:
        context.load_cert_chain(args.cert, args.key)
    return context
