"""`edge-agent config check FILE` and `edge-agent config show [--config FILE]`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from agent.config.loader import load_config
from agent.config.render import render_toml
from agent.errors import AgentConfigError

__all__ = ["DEFAULT_CONFIG_PATH", "check_command", "show_command"]

DEFAULT_CONFIG_PATH = Path("/etc/edge-agent/agent.toml")
EXIT_OK = 0
EXIT_CONFIG = 2


def check_command(path: Path, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """`edge-agent config check FILE`: validate a file as start-up would, without starting.

    The environment is not applied: the file is judged on its own.

    Returns:
        0 and `FILE: ok` on stdout, or 2 and one line on stderr naming the key and the problem.
    """
    try:
        load_config(path)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {_one_line(str(exc))}", file=err)
        return EXIT_CONFIG
    print(f"{path}: ok", file=out)
    return EXIT_OK


def show_command(
    path: Path | None,
    environ: Mapping[str, str],
    *,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`edge-agent config show [--config FILE]`: the effective config as TOML, secrets masked.

    Without `--config`, `/etc/edge-agent/agent.toml` is read when it exists. Environment
    overrides apply.

    Returns:
        0 with the TOML on stdout, or 2 with one line on stderr naming the key and the problem.
    """
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    try:
        config = load_config(path, None, environ)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {_one_line(str(exc))}", file=err)
        return EXIT_CONFIG
    source = str(path) if path is not None else "defaults"
    out.write(f"# effective edge-agent config ({source} + environment); secrets masked\n")
    out.write(render_toml(config))
    return EXIT_OK


def _one_line(text: str) -> str:
    return " ".join(text.split())
