"""Command line: `edge-agent serve ...`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from agent import __version__
from agent.config import AgentConfig, load_config
from agent.daemon import run_agent
from agent.errors import AgentConfigError, AgentError

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
        "--metrics-port", type=int, dest="server.metrics_port", help="default 8002; -1: off"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        dest="server.max_request_bytes",
        help="largest request body accepted (default 64 MiB)",
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
    serve.add_argument("--log-level", dest="log.level", help="debug, info, warning, error")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if "." in k}
    if overrides.get("models.load_models") is not None:
        overrides["models.load_models"] = tuple(overrides["models.load_models"])
    try:
        config = load_config(args.config, overrides)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    _setup_logging(config)
    # Inference threads hand the GIL back and forth with the event loop many thousand times a
    # second; with the default 5 ms switch interval a waiting thread stalls for up to 5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return _run(run_agent(config))
    except AgentError as exc:
        logging.getLogger("agent").critical("%s", exc.message)
        print(f"edge-agent: error: {exc.message}", file=sys.stderr)
        return EXIT_LOAD
    except OSError as exc:
        print(f"edge-agent: error: cannot listen: {exc.strerror}", file=sys.stderr)
        return EXIT_LOAD


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
    logging.basicConfig(
        level=config.log.level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
