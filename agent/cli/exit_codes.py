"""The exit statuses the `edge-agent` sub-commands share."""

from __future__ import annotations

__all__ = ["EXIT_CONFIG", "EXIT_LOAD"]

EXIT_CONFIG = 2  # bad flags, config or files named on the command line
EXIT_LOAD = 1  # the work itself failed: a model, the cache, the running agent
