"""`edge-agent serve`: its own front door, so a serving agent imports only what serving needs.

`agent.cli.main` sends `serve ARGS` here without building the parser of every other command
(whose modules pull in the fleet manager's MQTT client, the model cache's SQLite layer, the
model-signing library...). `edge-agent --help` still lists `serve` from `agent.cli.commands`,
which uses the same flags (`agent.cli.serve_args`) and the same `run`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from agent.cli.exit_codes import EXIT_CONFIG, EXIT_LOAD
from agent.cli.serve_args import add_serve_command, config_flags
from agent.config.loader import load_config
from agent.errors import AgentConfigError, AgentError

__all__ = ["SWITCH_INTERVAL_S", "main", "run"]

SWITCH_INTERVAL_S = 0.0002


def main(argv: Sequence[str]) -> int:
    """Run `edge-agent serve ARGS` (`argv` starts with "serve")."""
    parser = argparse.ArgumentParser(prog="edge-agent")
    add_serve_command(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT with the config from the file, environment and flags.

    Returns the exit code: EXIT_CONFIG for a config that does not load (one line on stderr,
    naming the extra to install where an optional feature's package is missing), EXIT_LOAD for
    a start-up that fails.
    """
    overrides = config_flags(args)
    try:
        # Precedence: flags, then EDGE_AGENT_<SECTION>_<KEY> variables, then the file.
        config = load_config(args.config, overrides, os.environ)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from agent.runtime.daemon import run_agent  # noqa: PLC0415 - after the config is good
    from agent.runtime.journal import setup_logging  # noqa: PLC0415

    setup_logging(config.log.level)
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
