"""Triton's trace file: one JSON array that grows, and indexed files `<trace_file>.<n>`.

Traces go to an indexed file (the next `n`, shared by every owner of settings) when an owner's
`log_frequency` traces are waiting, or when its `trace_count` ran out and every trace it took
is written. Otherwise they are appended to `<trace_file>` itself: when their owner's settings
change (Triton then retires the old settings object) and at stop. As in Triton, the first write
of a run starts the file afresh. Unlike Triton's, the file is a complete JSON array after every
write (the closing bracket is rewritten at each append), so it can be read while the agent runs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_CLOSE = b"\n]\n"


class TraceFile:
    """Writes batches of trace entries (one writer at a time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._index = 0
        self._started = False
        self._lock = threading.Lock()

    def save(self, entries: list[dict[str, Any]], *, indexed: bool) -> None:
        """Write `entries` to the next indexed file, or append them to the trace file."""
        if not entries or not self.path:
            return
        body = json.dumps(entries, indent=2).encode()  # "[\n  {...},\n  {...}\n]"
        with self._lock:
            try:
                if indexed:
                    path = f"{self.path}.{self._index}"
                    self._index += 1
                    Path(path).write_bytes(body + b"\n")
                elif self._started and _ends_closed(self.path):
                    with open(self.path, "r+b") as file:
                        file.seek(-len(_CLOSE), os.SEEK_END)
                        file.write(b"\n," + body[1:-2] + _CLOSE)
                else:
                    Path(self.path).write_bytes(body[:-2] + _CLOSE)
                    self._started = True
            except OSError as exc:
                logger.error("cannot write the trace file %s: %s", self.path, exc)


def _ends_closed(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            file.seek(-len(_CLOSE), os.SEEK_END)
            return file.read() == _CLOSE
    except OSError:
        return False
