"""Command line: `edge-agent serve ...`."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from agent import __version__
from agent.backends import tensorrt_build as engine_build
from agent.cli import doctor as doctor_cli
from agent.cli import fleet as fleet_cli
from agent.cli import sign_model
from agent.config.loader import load_config
from agent.config.schema import AgentConfig
from agent.config.tools import check_command, show_command
from agent.errors import AgentConfigError, AgentError
from agent.faults import fault
from agent.quantize import args as quantize_args
from agent.runtime.daemon import run_agent
from agent.runtime.journal import setup_logging
from model_cache import CacheError, ModelCache, collect
from sync.cli_parser import SYNC_COMMANDS
from sync.cli_parser import add_commands as add_sync_commands

SWITCH_INTERVAL_S = 0.0002
EXIT_CONFIG = 2
EXIT_LOAD = 1


def _bool_value(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model repository over KServe v2 HTTP")
    serve.add_argument("--config", type=Path, help="TOML config file (flags win over it)")
    serve.add_argument("--model-repository", type=Path, dest="models.repository", metavar="DIR")
    serve.add_argument(
        "--demo",
        action="store_const",
        const=True,
        dest="models.demo",
        help="serve the built-in demo repository (generated locally on first use)",
    )
    serve.add_argument("--host", dest="server.host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, dest="server.http_port", help="default 8000")
    serve.add_argument(
        "--grpc-port", type=int, dest="server.grpc_port", help="default 8001; -1: off"
    )
    serve.add_argument(
        "--metrics-port", type=int, dest="server.metrics_port", help="default 8002; -1: off"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        dest="server.max_request_bytes",
        help="largest request body accepted (default 64 MiB)",
    )
    serve.add_argument(
        "--shared-memory",
        action=argparse.BooleanOptionalAction,
        dest="server.shared_memory",
        help="let local clients pass tensors in system shared memory (default on)",
    )
    serve.add_argument(
        "--tls-cert-file",
        type=Path,
        dest="server.tls_cert_file",
        metavar="PEM",
        help="serve HTTP, gRPC and metrics over TLS with this certificate (chain)",
    )
    serve.add_argument("--tls-key-file", type=Path, dest="server.tls_key_file", metavar="PEM")
    serve.add_argument(
        "--tls-client-ca-file",
        type=Path,
        dest="server.tls_client_ca_file",
        metavar="PEM",
        help="mutual TLS: require client certificates signed by this CA",
    )
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        dest="server.http_restricted_api",
        metavar="<API>,...:<KEY>=<VALUE>",
        help="Triton's restricted API group: these APIs answer only requests with header KEY: "
        "VALUE (repeatable; groups: health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging, cache, canary)",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        dest="server.grpc_restricted_protocol",
        metavar="<PROTOCOL>,...:<KEY>=<VALUE>",
        help="the same for gRPC (metadata triton-grpc-protocol-KEY: VALUE)",
    )
    serve.add_argument(
        "--strict-security",
        action="store_const",
        const=True,
        dest="server.strict_security",
        help="refuse to start beyond loopback without TLS and restricted control groups",
    )
    serve.add_argument(
        "--exit-on-error",
        action=argparse.BooleanOptionalAction,
        dest="models.exit_on_error",
        help="stop start-up when a model fails to load (default) or serve the rest",
    )
    serve.add_argument(
        "--strict-model-config",
        type=_bool_value,
        nargs="?",
        const=True,
        dest="models.strict_model_config",
        metavar="BOOL",
        help="true: never complete configs from the model file (default false)",
    )
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_const",
        const=True,
        dest="models.strict_model_config",
        help="same as --strict-model-config=true",
    )
    serve.add_argument("--intra-op-threads", type=int, dest="models.intra_op_threads")
    serve.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        dest="models.control_mode",
        help="none: serve what is there at start; poll: watch the repository; explicit: load "
        "and unload on request (default none)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        dest="models.load_models",
        metavar="MODEL",
        help="explicit mode: load this model at start (repeatable; '*' loads all)",
    )
    serve.add_argument(
        "--memory-budget-bytes",
        type=int,
        dest="models.memory_budget_bytes",
        help="memory the models may use (default: cgroup memory.max, else 80%% of RAM)",
    )
    serve.add_argument(
        "--response-cache-bytes",
        type=int,
        dest="models.response_cache_bytes",
        help="agent-wide response cache size (default 64 MiB)",
    )
    serve.add_argument(
        "--cache-dir",
        type=Path,
        dest="cache.dir",
        help="model cache root: serve its repository view (versions activated atomically)",
    )
    serve.add_argument("--log-level", dest="log.level", help="debug, info, warning, error")
    serve.add_argument(
        "--trace-file",
        type=Path,
        dest="log.trace_file",
        help="where request traces go (Triton's trace JSON; turn on with /v2/trace/setting)",
    )
    serve.add_argument(
        "--trace-mode",
        choices=("triton", "opentelemetry"),
        dest="log.trace_mode",
        help="triton: the trace file (default); opentelemetry: spans over OTLP/HTTP",
    )
    serve.add_argument(
        "--trace-otlp-url",
        dest="log.trace_otlp_url",
        metavar="URL",
        help="opentelemetry mode: the collector (default http://localhost:4318/v1/traces)",
    )
    serve.add_argument(
        "--trace-otlp-resource",
        action="append",
        dest="log.trace_otlp_resource",
        metavar="KEY=VALUE",
        help="opentelemetry mode: a resource attribute (repeatable; default "
        "service.name=triton-inference-server)",
    )

    cache = commands.add_parser("cache", help="the local model cache (agent stopped)")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    install = cache_commands.add_parser("install", help="add a model version to the cache")
    install.add_argument("model")
    install.add_argument("version", type=int)
    install.add_argument("source", type=Path, help="Triton model folder (config.pbtxt, N/...)")
    install.add_argument("--cache-dir", type=Path, required=True)
    install.add_argument("--activate", action="store_true", help="also serve it")
    listing = cache_commands.add_parser("list", help="cached versions and their states")
    listing.add_argument("model", nargs="?")
    listing.add_argument("--cache-dir", type=Path, required=True)
    gc = cache_commands.add_parser("gc", help="drop old versions and unreferenced files")
    gc.add_argument("--cache-dir", type=Path, required=True)
    gc.add_argument("--keep-last", type=int, default=2)
    gc.add_argument("--disk-budget-bytes", type=int, default=0)

    config_parser = commands.add_parser("config", help="check or show the agent's config")
    config_commands = config_parser.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a config file without starting")
    check.add_argument("file", type=Path)
    show = config_commands.add_parser(
        "show", help="print the effective config (file + EDGE_AGENT_* variables), secrets masked"
    )
    show.add_argument("--config", type=Path, help="default: /etc/edge-agent/agent.toml if present")

    add_sync_commands(commands)
    quantize_args.add_commands(commands)
    engine_build.add_commands(commands)
    fleet_cli.add_commands(commands)
    sign_model.add_commands(commands)
    doctor_cli.add_commands(commands)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sync":
        return sync_command(args)
    if args.command in SYNC_COMMANDS:
        from sync.cli import run as run_sync  # noqa: PLC0415 - boto3 and tuf only when needed

        if args.command == "publish":  # validate the folder as the agent would load it
            from agent.cli.publish_check import folder_check  # noqa: PLC0415 - onnxruntime

            return run_sync(args, check=folder_check(load=not args.no_verify_model))
        return run_sync(args)
    if args.command == "fleet":
        return fleet_cli.run(args)
    if args.command in ("sign-model", "verify-model"):
        return sign_model.run(args)
    if args.command == "doctor":
        return doctor_cli.run(args)
    if args.command == "quantize":
        from agent.quantize import command as quantize  # noqa: PLC0415 - onnx only here

        return quantize.run(args)
    if args.command == "build-engine":
        return engine_build.run(args)
    if args.command == "cache":
        return cache_command(args)
    if args.command in ("activate", "rollback", "clear-rejected"):
        return swap_command(args)
    if args.command == "config":
        if args.config_command == "check":
            return check_command(args.file)
        return show_command(args.config, os.environ)
    overrides = _flags(args)
    try:
        # Precedence: flags, then EDGE_AGENT_<SECTION>_<KEY> variables, then the file.
        config = load_config(args.config, overrides, os.environ)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    _setup_logging(config)
    # Inference threads hand the GIL back and forth with the event loop many thousand times a
    # second; with the default 5 ms switch interval a waiting thread stalls for up to 5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        reload_config = functools.partial(load_config, args.config, overrides, os.environ)
        return _run(run_agent(config, reload_config))
    except AgentError as exc:
        logging.getLogger("agent").critical("%s", exc.message)
        print(f"edge-agent: error: {exc.message}", file=sys.stderr)
        return EXIT_LOAD
    except OSError as exc:
        print(f"edge-agent: error: cannot listen: {exc.strerror}", file=sys.stderr)
        return EXIT_LOAD


def sync_command(args: argparse.Namespace) -> int:
    """`edge-agent sync --once`: the config as `serve` reads it (file, environment, flags)."""
    try:
        config = load_config(args.config, _flags(args), os.environ, serving=False)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from sync.cli import sync_once  # noqa: PLC0415 - boto3 and tuf only when needed

    return sync_once(config.sync, config.cache.dir, activate=not args.no_activate)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags whose destination is a `section.key` of the config (None: not given)."""
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if "." in k}
    for key in (
        "models.load_models",
        "sync.desired",
        "log.trace_otlp_resource",
        "server.http_restricted_api",
        "server.grpc_restricted_protocol",
    ):
        if flags.get(key) is not None:
            flags[key] = tuple(flags[key])
    return flags


def cache_command(args: argparse.Namespace) -> int:
    """`edge-agent cache ...`: works on the cache directly, so the agent must be stopped."""
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        with ModelCache(args.cache_dir) as cache:
            if args.cache_command == "install":
                done = cache.install(args.model, args.version, args.source, fault=fault)
                if args.activate:
                    done = cache.activate(args.model, args.version, fault=fault)
                print(
                    f"{done.model} version {done.version}: {done.state.value} ({done.digest[:12]})"
                )
            elif args.cache_command == "list":
                for model in [args.model] if args.model else cache.models():
                    refused = {r.version: r for r in cache.rejections.entries(model)}
                    for v in cache.list_versions(model):
                        reason = f"  {v.reason}" if v.reason else ""
                        if v.version in refused:
                            item = refused[v.version]
                            reason += f"  rejected ({item.cause.value}): {item.reason}"
                        print(f"{v.model}\t{v.version}\t{v.state.value}\t{v.digest[:12]}{reason}")
            else:
                report = collect(
                    cache,
                    keep_last=args.keep_last,
                    disk_budget_bytes=args.disk_budget_bytes or None,
                )
                print(report)
    except CacheError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_LOAD
    return 0


def swap_command(args: argparse.Namespace) -> int:
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


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop where it is installed (a faster event loop than asyncio's own)."""
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up
    except ImportError:
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    uvloop.install()
    return asyncio.run(main)


def _setup_logging(config: AgentConfig) -> None:
    setup_logging(config.log.level)
