"""Fault injection for crash tests: die by SIGKILL at a named step.

`EDGE_AGENT_CRASH_AT=STEP` makes the process kill itself at STEP (a swap step here, or a cache
install/activate step passed to `model_cache` as its fault hook). Unset, every call is a no-op.
Used only by the tests that show a SIGKILL at any step leaves a complete version served.
"""

from __future__ import annotations

import os
import signal

ENV = "EDGE_AGENT_CRASH_AT"


def fault(step: str) -> None:
    """Kill this process with SIGKILL when the environment names `step`."""
    if os.environ.get(ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
