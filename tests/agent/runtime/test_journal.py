"""Structured journal logging: the native protocol over a real datagram socket."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.runtime.journal import JournalHandler, encode_fields, journal_wanted


def parse(datagram: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(datagram):
        end = datagram.index(b"\n", pos)
        line = datagram[pos:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            pos = end + 1
        else:
            (length,) = struct.unpack("<Q", datagram[end + 1 : end + 9])
            fields[line.decode()] = datagram[end + 9 : end + 9 + length].decode()
            pos = end + 9 + length + 1
    return fields


@pytest.fixture
def journal_socket(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = tmp_path / "journal.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_record_carries_model_and_version_fields(
    journal_socket: tuple[Path, socket.socket],
) -> None:
    path, sock = journal_socket
    handler = JournalHandler(path)
    log = logging.getLogger("edge-agent-test-journal")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.warning("model %s ready", "resnet", extra={"model": "resnet", "version": 3})
    finally:
        log.removeHandler(handler)
        handler.close()
    fields = parse(sock.recv(65536))
    assert fields["MESSAGE"] == "model resnet ready"
    assert fields["PRIORITY"] == "4"
    assert fields["MODEL"] == "resnet"
    assert fields["VERSION"] == "3"
    assert fields["SYSLOG_IDENTIFIER"] == "edge-agent"
    assert fields["CODE_FUNC"] == "test_record_carries_model_and_version_fields"


def test_multiline_values_are_length_prefixed() -> None:
    assert parse(encode_fields({"MESSAGE": "a\nb", "X": "y"})) == {"MESSAGE": "a\nb", "X": "y"}


def test_journal_only_under_systemd(journal_socket: tuple[Path, socket.socket]) -> None:
    path, _sock = journal_socket
    assert journal_wanted({"JOURNAL_STREAM": "8:1234"}, path)
    assert not journal_wanted({}, path)
    assert not journal_wanted({"JOURNAL_STREAM": "8:1234"}, path.parent / "missing.sock")


def test_a_missing_journal_never_breaks_logging(tmp_path: Path) -> None:
    handler = JournalHandler(tmp_path / "gone.sock")
    failed: list[logging.LogRecord] = []
    handler.handleError = failed.append  # type: ignore[method-assign,assignment]
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    handler.emit(record)  # the send fails; logging's own error path takes it, nothing raises
    handler.close()
    assert failed == [record]
