"""Reports how many examples each property test ran, at the end of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis.statistics import collector

_COUNTS = pytest.StashKey[dict[str, int]]()


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Count the test cases each phase ran (explicit examples, generated ones, shrinks)."""
    counts = item.config.stash.setdefault(_COUNTS, {})
    outer: Callable[[Any], None] | None = collector.value

    def note(stats: dict[str, Any]) -> None:
        phases = ("explicit", "reuse", "generate", "target", "shrink")
        counts[item.nodeid] = sum(
            len(stats.get(f"{phase}-phase", {}).get("test-cases", [])) for phase in phases
        )
        if outer is not None:
            outer(stats)

    # hypothesis types the collector as holding None; it holds this callback during a test.
    with collector.with_value(note):  # type: ignore[arg-type]
        yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    counts = config.stash.get(_COUNTS, {})
    if not counts:
        return
    terminalreporter.section("property tests: examples run")
    for nodeid, count in sorted(counts.items()):
        terminalreporter.write_line(f"{count:>7}  {nodeid}")
