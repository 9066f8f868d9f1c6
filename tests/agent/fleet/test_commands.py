"""Pure command parsing: typed results, and an error for everything else."""

from __future__ import annotations

import json

import pytest

from agent.canary.policy import CanaryPolicy
from agent.fleet import commands as c
from agent.manager.cli import parse_args


def parse(doc: object, limit: int = 4096) -> c.Command:
    return c.parse_command(json.dumps(doc).encode(), max_bytes=limit)


def test_every_command_parses_to_its_type() -> None:
    assert parse({"id": "1", "command": "ping"}).body == c.Ping()
    assert parse({"id": "2", "command": "status", "schema": 1}).body == c.Status()
    assert parse({"id": "3", "command": "sync", "args": {}}).body == c.Sync()
    desired = parse(
        {"id": "4", "command": "set-desired", "args": {"models": {"m": "1,2", "*": "latest"}}}
    )
    assert desired.body == c.SetDesired((("*", "latest"), ("m", "1,2")))
    assert isinstance(desired.body, c.SetDesired)
    assert desired.body.as_lines() == ("*=latest", "m=1,2")
    load = parse(
        {"id": "5", "command": "load", "args": {"model": "m", "config": {"max_batch_size": 2}}}
    )
    assert load.body == c.Load("m", {"max_batch_size": 2})
    assert parse({"id": "6", "command": "unload", "args": {"model": "m"}}).body == c.Unload("m")
    assert parse({"id": "7", "command": "activate", "args": {"model": "m", "version": 3}}).body == (
        c.Activate("m", 3)
    )
    assert parse({"id": "8", "command": "rollback", "args": {"model": "m"}}).body == c.Rollback("m")
    batching = parse(
        {"id": "9", "command": "set-batching",
         "args": {"model": "m", "max_queue_delay_us": 0, "preferred_batch_sizes": [2, 4]}}
    )  # fmt: skip
    assert batching.body == c.SetBatching("m", None, None, 0, (2, 4))
    assert batching.name == "set-batching"
    lift = parse({"id": "10", "command": "clear-rejected", "args": {"model": "m", "version": 2}})
    assert lift.body == c.ClearRejected("m", 2)
    assert parse({"id": "11", "command": "clear-rejected", "args": {"model": "m"}}).body == (
        c.ClearRejected("m")
    )


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        ({"id": "a", "command": "rollback", "args": {"model": "m", "version": True}}, "integer"),
        ({"id": "a", "command": "rollback", "args": {"model": "m", "version": 0}}, ">= 1"),
        ({"id": "a", "command": "rollback", "args": {"model": "m", "version": 2**40}}, "too large"),
        ({"id": "a", "command": "load", "args": {}}, "needs"),
        ({"id": "a", "command": "load", "args": {"model": ".hidden"}}, "model name"),
        ({"id": "a", "command": "load", "args": {"model": "m", "config": []}}, "JSON object"),
        ({"id": "a", "command": "load", "args": []}, "'args'"),
        ({"id": "a", "command": 5}, "unknown command"),
        ({"id": "a" * 129, "command": "ping"}, "'id'"),
        ({"id": "a", "command": "set-desired", "args": {}}, "models"),
        ({"id": "a", "command": "clear-rejected", "args": {}}, "needs the argument 'model'"),
        ({"id": "a", "command": "clear-rejected", "args": {"model": "m", "v": 1}}, "unknown"),
        ({"id": "a", "command": "set-desired", "args": {"models": {"m": 3}}}, "policy"),
        ({"id": "a", "command": "set-desired", "args": {"models": {"m": "0"}}}, "policy"),
        (
            {
                "id": "a",
                "command": "set-batching",
                "args": {"model": "m", "preferred_batch_sizes": [0]},
            },
            "integers >= 1",
        ),
    ],
)
def test_bad_commands_raise_command_error(doc: object, text: str) -> None:
    with pytest.raises(c.CommandError, match=text) as caught:
        parse(doc)
    if isinstance(doc, dict) and doc.get("id") == "a":
        assert caught.value.command_id == "a"


def test_size_limit_checked_before_parsing() -> None:
    with pytest.raises(c.CommandTooLargeError, match="over the 10 limit"):
        c.parse_command(b"{" * 11, max_bytes=10)


def test_cli_arguments() -> None:
    assert parse_args(["model=m", "version=2", "x=[1]", "s=hello"], None) == {
        "model": "m", "version": 2, "x": [1], "s": "hello",
    }  # fmt: skip
    assert parse_args(["v=3"], '{"models": {"*": "latest"}}') == {
        "models": {"*": "latest"}, "v": 3,
    }  # fmt: skip
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_args(["oops"], None)
    with pytest.raises(ValueError, match="JSON object"):
        parse_args([], "[1]")


def test_canary_commands_parse() -> None:
    args = {"model": "m", "version": 2, "share": 0.1, "window": 20, "promote_after": 40}
    start = parse({"id": "c", "command": "canary-start", "args": args})
    assert start.body == c.CanaryStart("m", CanaryPolicy(2, 0.1, 40, 20))
    alias = parse({"id": "c", "command": "canary_start", "args": args})
    assert (alias.name, alias.body) == ("canary_start", start.body)
    stop = parse({"id": "s", "command": "canary_stop", "args": {"model": "m"}})
    assert stop.body == c.CanaryStop("m")
    status = parse({"id": "t", "command": "canary-status", "args": {"model": "m"}})
    assert status.body == c.CanaryStatus("m")
    with pytest.raises(c.CommandError, match=r"share must be in \(0, 1\)") as caught:
        parse({"id": "x", "command": "canary_start", "args": {**args, "share": 0}})
    assert caught.value.command_id == "x"
    with pytest.raises(c.CommandError, match="unknown canary key 'speed'"):
        parse({"id": "x", "command": "canary_start", "args": {**args, "speed": 1}})
    with pytest.raises(c.CommandError, match="model name"):
        parse({"id": "x", "command": "canary_stop", "args": {"model": ""}})
