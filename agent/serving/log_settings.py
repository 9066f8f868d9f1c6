"""Triton's logging extension: read and change the agent's log settings while it runs.

The settings are Triton's (`GET/POST /v2/logging`, gRPC `LogSettings`): `log_file` (read-only
over the network, as in Triton), `log_info`, `log_warning`, `log_error` (each level on or off),
`log_verbose_level` (0: no DEBUG records; 1 or more: DEBUG records on) and `log_format`
(`default` or `ISO8601`). Python logging is process-wide, so one `LogSettings` drives the root
logger: its level is the lowest level switched on (the `isEnabledFor` check every log call makes
anyway, so nothing is added to the hot path), and a filter on the root handlers drops a level
switched off between two that are on (e.g. warnings off, errors on). The format applies to the
handlers the agent installed itself (named `AGENT_HANDLER_NAME`); the journal handler keeps its
plain message, the journal has its own timestamps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from agent.errors import InvalidInputError

AGENT_HANDLER_NAME = "edge-agent"
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("default", "ISO8601")
_ISO_DATEFMT = "%Y-%m-%dT%H:%M:%SZ"
_UINT32_MAX = 2**32 - 1
_BOOL_KEYS = ("log_info", "log_warning", "log_error")
KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


class _LevelFilter(logging.Filter):
    """Drops records of a level switched off (only reached by records the root level let by)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__("")
        self._settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._settings.gaps or self._settings.enabled(record.levelno)


class LogSettings:
    """The live log settings of the process, in Triton's keys and types."""

    def __init__(self, log_file: str = "", root: logging.Logger | None = None) -> None:
        self._root = root or logging.getLogger()
        self._lock = threading.Lock()
        self.log_file = log_file
        self.log_format = "default"
        self.gaps = False  # a level off above the lowest one on: the filter has work to do
        self._filter = _LevelFilter(self)
        self._from_level(self._root.level or logging.WARNING)

    def _from_level(self, level: int) -> None:
        self.log_info = level <= logging.INFO
        self.log_warning = level <= logging.WARNING
        self.log_error = level <= logging.ERROR
        self.log_verbose_level = 1 if level <= logging.DEBUG else 0

    def set_level(self, name: str) -> None:
        """Back to one threshold (`debug`, `info`, ...), as `--log-level` and SIGHUP set it."""
        with self._lock:
            self._from_level(logging.getLevelName(name.upper()))
            self._apply()

    def get(self) -> dict[str, Any]:
        """All settings, in Triton's order."""
        return {
            "log_file": self.log_file,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply the settings given (a value of None leaves one unchanged); all settings after.

        Everything is checked before anything changes, so a refused request changes nothing.

        Raises:
            InvalidInputError: an unknown key, a value of the wrong type, an unknown format, or
                a new `log_file` (Triton does not move the log file over the network either).
        """
        wanted = {key: value for key, value in changes.items() if value is not None}
        for key in changes:
            if key not in KEYS:
                raise InvalidInputError(
                    f"unknown log setting '{key}', expected one of: {', '.join(KEYS)}"
                )
        for key, value in wanted.items():
            _check(key, value)
        with self._lock:
            for key, value in wanted.items():
                setattr(self, key, value)
            self._apply()
        return self.get()

    def enabled(self, levelno: int) -> bool:
        """Whether a record of this level is switched on."""
        if levelno >= logging.ERROR:
            return self.log_error
        if levelno >= logging.WARNING:
            return self.log_warning
        if levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def _apply(self) -> None:
        lowest = logging.CRITICAL + 10  # everything off
        for level in (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG):
            if self.enabled(level):
                lowest = level
        self._root.setLevel(lowest)
        levels = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)
        self.gaps = any(level > lowest and not self.enabled(level) for level in levels)
        for handler in self._root.handlers:
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)
            if handler.get_name() == AGENT_HANDLER_NAME and handler.formatter is not None:
                handler.setFormatter(formatter(self.log_format))


def formatter(log_format: str) -> logging.Formatter:
    """The formatter for one of Triton's log formats."""
    if log_format == "ISO8601":
        iso = logging.Formatter(LINE_FORMAT, datefmt=_ISO_DATEFMT)
        iso.converter = time.gmtime
        return iso
    return logging.Formatter(LINE_FORMAT)


def _check(key: str, value: Any) -> None:
    if key == "log_file":
        raise InvalidInputError("log file location can not be updated through network protocol")
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise InvalidInputError(f"expect boolean for '{key}'")
    elif key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32_MAX:
            raise InvalidInputError(f"expect unsigned integer for '{key}'")
    elif key == "log_format":
        if not isinstance(value, str):
            raise InvalidInputError(f"expect string for '{key}'")
        if value not in FORMATS:
            raise InvalidInputError(f"invalid argument for log_format, got: {value}")
