"""Triton's `pb_utils.Logger`: a Python model's log lines, and where they go.

Inside a worker the lines travel to the agent's log (the worker sets the sink); elsewhere they
go to stderr. Re-exported by `agent.pb_utils`; needs only the standard library.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys
from collections.abc import Callable
from typing import ClassVar


class LogLevel(enum.IntEnum):
    """Levels of `Logger.log` (Triton's `pb_utils.Logger.LogLevel`)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


# Where Logger lines go: (level, message, file, line). The worker sends them to the agent's log;
# elsewhere (a model imported in a test) they go to stderr.
LogSink = Callable[[LogLevel, str, str, int], None]


def _stderr_sink(level: LogLevel, message: str, filename: str, line: int) -> None:
    print(f"{level.name[0]} {os.path.basename(filename)}:{line}] {message}", file=sys.stderr)


_log_sink: LogSink = _stderr_sink


def set_log_sink(sink: LogSink | None) -> None:
    """Send `Logger` lines to `sink` (None: back to stderr). The worker calls this."""
    global _log_sink  # noqa: PLW0603 - one sink per process, as Triton's stub has one logger
    _log_sink = sink or _stderr_sink


_Level = LogLevel  # Logger.LogLevel is the same enum (a class attribute of that name)


class Logger:
    """Triton's `pb_utils.Logger`: lines in the agent's log, tagged with the model's name."""

    LogLevel: ClassVar[type[_Level]] = _Level
    INFO: ClassVar[_Level] = _Level.INFO
    WARNING: ClassVar[_Level] = _Level.WARNING
    ERROR: ClassVar[_Level] = _Level.ERROR
    VERBOSE: ClassVar[_Level] = _Level.VERBOSE

    @staticmethod
    def log(message: str, level: _Level = _Level.INFO) -> None:
        Logger._emit(message, _Level(level))

    @staticmethod
    def log_info(message: str) -> None:
        Logger._emit(message, _Level.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger._emit(message, _Level.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger._emit(message, _Level.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger._emit(message, _Level.VERBOSE)

    @staticmethod
    def _emit(message: str, level: _Level) -> None:
        # The caller of log/log_info/...: two frames up from here, as Triton reports file:line.
        frame = inspect.currentframe()
        caller = frame.f_back.f_back if frame and frame.f_back else None
        filename, line = (caller.f_code.co_filename, caller.f_lineno) if caller else ("", 0)
        _log_sink(level, str(message), filename, line)
