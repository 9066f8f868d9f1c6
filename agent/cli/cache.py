"""`edge-agent cache install|list|gc`: the local model cache, worked on directly (agent stopped)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agent.cli.exit_codes import EXIT_LOAD
from agent.faults import fault
from model_cache import CacheError, ModelCache, collect

__all__ = ["add_commands", "run"]


def add_commands(commands: Any) -> None:
    """Add `cache` and its sub-commands to the sub-command parsers."""
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


def run(args: argparse.Namespace) -> int:
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
