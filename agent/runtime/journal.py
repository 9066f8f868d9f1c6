"""Log records to the systemd journal with structured fields.

Under systemd (the unit's stderr is the journal, so `JOURNAL_STREAM` is set) records go to the
journal's native socket as datagrams of `FIELD=value` lines: `MESSAGE`, `PRIORITY`,
`SYSLOG_IDENTIFIER`, `LOGGER`, `CODE_FILE`/`CODE_LINE`/`CODE_FUNC`, and the agent's own fields
passed as `extra=` on a log call: `MODEL`, `VERSION`, `REQUEST_ID`, `STRATEGY`
(`journalctl -u edge-agent MODEL=resnet`). Elsewhere logging stays plain text on stderr.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

from agent.serving.log_settings import AGENT_HANDLER_NAME, formatter

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
EXTRA_FIELDS = ("model", "version", "request_id", "strategy")
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def journal_wanted(environ: Mapping[str, str], socket_path: Path = JOURNAL_SOCKET) -> bool:
    """True when stderr is the journal (systemd sets JOURNAL_STREAM) and its socket is there."""
    return bool(environ.get("JOURNAL_STREAM")) and socket_path.exists()


def encode_fields(fields: Mapping[str, str]) -> bytes:
    """The journal's native datagram format (multi-line values are length-prefixed)."""
    parts = []
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            parts.append(key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(key.encode() + b"=" + data + b"\n")
    return b"".join(parts)


class JournalHandler(logging.Handler):
    """Sends each record to the journal socket; never blocks and never raises into the caller."""

    def __init__(self, socket_path: Path = JOURNAL_SOCKET, identifier: str = "edge-agent") -> None:
        super().__init__()
        self._path = str(socket_path)
        self._identifier = identifier
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        """The journal fields for one record."""
        fields = {
            "MESSAGE": self.format(record),
            "PRIORITY": str(_PRIORITY.get(record.levelno, 6)),
            "SYSLOG_IDENTIFIER": self._identifier,
            "LOGGER": record.name,
            "CODE_FILE": record.pathname or "",
            "CODE_LINE": str(record.lineno),
            "CODE_FUNC": record.funcName or "",
        }
        for name in EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                fields[name.upper()] = str(value)
        if record.exc_info and record.exc_text is None:
            fields["MESSAGE"] += "\n" + logging.Formatter().formatException(record.exc_info)
        return fields

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._socket.sendto(encode_fields(self.fields(record)), self._path)
        except OSError:
            self.handleError(record)

    def close(self) -> None:
        self._socket.close()
        super().close()


def setup_logging(level: str, environ: Mapping[str, str] | None = None) -> None:
    """Journal with structured fields under systemd, plain text on stderr elsewhere."""
    env = os.environ if environ is None else environ
    handler: logging.Handler
    if journal_wanted(env):
        handler = JournalHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter("default"))
    handler.set_name(AGENT_HANDLER_NAME)  # `agent.serving.log_settings` changes its format live
    logging.basicConfig(level=level.upper(), handlers=[handler])
