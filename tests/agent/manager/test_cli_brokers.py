"""`fleet ... --brokers HOST:PORT,...`: the brokers a tool fails over to, or one line saying
what is wrong."""

from __future__ import annotations

import pytest

from agent.manager import cli


def test_brokers_are_read_in_order() -> None:
    assert cli.broker_list("a:1, b.example:1883,") == (("a", 1), ("b.example", 1883))


@pytest.mark.parametrize("text", ["a", "a:", ":1", "a:0", "a:70000", "a:x"])
def test_a_bad_broker_is_refused_with_exit_code_2(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["inventory", "--brokers", text])
    assert stop.value.code == 2
    assert f"broker {text!r} is not HOST:PORT" in capsys.readouterr().err
