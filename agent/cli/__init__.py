"""The `edge-agent` command line: one front door per sub-command."""

from agent.cli.main import main

__all__ = ["main"]
