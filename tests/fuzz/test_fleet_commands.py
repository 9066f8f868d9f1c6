"""MQTT command payloads: any bytes get a clear rejection, never an exception escaping.

Property: `parse_command` returns a typed command or raises `CommandError` /
`CommandTooLargeError` (answered on the reply topic), whatever the payload.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from agent.fleet.commands import CommandError, CommandTooLargeError, parse_command
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import JSON, assert_reason, nested

MAX_BYTES = 64 * 1024
COMMANDS = [
    "status", "ping", "sync", "set-desired", "load", "unload", "activate", "rollback",
    "clear-rejected", "set-batching", "canary-start", "canary-stop", "canary-status", "nope",
]  # fmt: skip
ARG_KEYS = [
    "model", "version", "config", "models", "max_batch_size", "max_queue_delay_us",
    "preferred_batch_sizes", "share", "promote_after", "window", "max_error_rate", "max_p95_ms",
]  # fmt: skip
_VALUES = JSON | st.sampled_from(["resnet", "*", "latest", "3", "../x", ""]) | st.integers()


def _parsed_or_refused(payload: bytes) -> None:
    try:
        parse_command(payload, max_bytes=MAX_BYTES)
    except (CommandError, CommandTooLargeError) as exc:
        assert_reason(exc)


@st.composite
def _command(draw: st.DrawFn) -> bytes:
    doc: dict[str, Any] = {
        "id": draw(st.sampled_from(["c-1", "", "x" * 129]) | JSON),
        "command": draw(st.sampled_from(COMMANDS) | JSON),
        "args": draw(
            st.dictionaries(st.sampled_from(ARG_KEYS) | st.text(max_size=4), _VALUES, max_size=5)
            | JSON
        ),
    }
    if draw(st.booleans()):
        doc["schema"] = draw(st.sampled_from([1, 2, "1", None]))
    for key in draw(st.lists(st.sampled_from(["id", "command", "args"]), max_size=1)):
        doc.pop(key, None)
    return json.dumps(doc).encode()


@FUZZ
@given(st.binary(max_size=300))
@example(nested(100_000).encode())  # deeper than the JSON parser's stack
@example(b"\xff\xfe")
def test_any_bytes_are_parsed_or_refused(payload: bytes) -> None:
    _parsed_or_refused(payload)


@FUZZ
@given(_command())
@example(b'{"id":"c","command":"set-desired","args":{"models":{"m":"' + b"9" * 5000 + b'"}}}')
def test_commands_with_any_arguments_are_parsed_or_refused(payload: bytes) -> None:
    _parsed_or_refused(payload)
