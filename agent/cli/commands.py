"""The parser and dispatch of every `edge-agent` sub-command (the front door is `agent.cli.main()`).

Named `commands`, not `main`: a submodule `agent.cli.main` would replace the package's `main`
function as an attribute once imported, and `from agent.cli import main` would get the module.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from agent import __version__
from agent.backends.tensorrt import build as engine_build
from agent.cli import cache as cache_cli
from agent.cli import doctor as doctor_cli
from agent.cli import serve, sign_model, swap
from agent.cli.exit_codes import EXIT_CONFIG
from agent.cli.serve_args import add_serve_command, config_flags
from agent.config.extras import missing_extra
from agent.config.loader import load_config
from agent.config.tools import check_command, show_command
from agent.errors import AgentConfigError
from agent.manager import cli as fleet_cli
from agent.quantize import args as quantize_args
from sync.cli_parser import SYNC_COMMANDS
from sync.cli_parser import add_commands as add_sync_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)

    cache_cli.add_commands(commands)

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

    swap.add_commands(commands)
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
    if args.command in ("sign-model", "verify-model", "quantize"):
        extra = "quantize" if args.command == "quantize" else "signing"
        missing = missing_extra(extra, f"edge-agent {args.command}")
        if missing is not None:
            print(f"edge-agent: error: {missing}", file=sys.stderr)
            return EXIT_CONFIG
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
        return cache_cli.run(args)
    if args.command in swap.VERBS:
        return swap.run(args)
    if args.command == "config":
        if args.config_command == "check":
            return check_command(args.file)
        return show_command(args.config, os.environ)
    return serve.run(args)


def sync_command(args: argparse.Namespace) -> int:
    """`edge-agent sync --once`: the config as `serve` reads it (file, environment, flags)."""
    try:
        config = load_config(args.config, config_flags(args), os.environ, serving=False)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from sync.cli import sync_once  # noqa: PLC0415 - boto3 and tuf only when needed

    return sync_once(config.sync, config.cache.dir, activate=not args.no_activate)
