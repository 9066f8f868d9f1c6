"""What every inference reads off a request, whichever path serves it (one response or a
stream): Triton's scheduling parameters, and the wall clock the statistics record."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agent.errors import InvalidInputError


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def scheduling_parameters(params: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The request parameters `priority` and `timeout` (microseconds), as Triton reads them."""
    priority = params.get("priority")
    timeout = params.get("timeout")
    for label, value in (("priority", priority), ("timeout", timeout)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise InvalidInputError(f"parameter '{label}' must be a non-negative integer")
    return priority, timeout
