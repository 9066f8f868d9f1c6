"""The test tiers of tests/conftest.py: which tests `make check` leaves to `make test`."""

from __future__ import annotations

import types

import pytest

from tests.conftest import MARKS_BY_PATH, check_table, table_marks


def test_a_folder_marks_every_test_in_it() -> None:
    assert table_marks("bench/test_latency_pairs.py", "test_anything") == {"bench"}
    assert table_marks("gpu/test_tensorrt.py", "test_anything") == {"external"}
    assert table_marks("benchmarks/test_x.py", "test_anything") == set()  # a prefix, not a folder


def test_a_named_test_is_marked_and_its_neighbours_are_not() -> None:
    path, name = "agent/api/test_openapi.py", "test_the_agent_serves_the_document"
    assert f"{path}::{name}" in MARKS_BY_PATH
    assert table_marks(path, name) == {"e2e"}
    assert table_marks(path, "test_the_document_is_valid") == set()


def test_a_renamed_test_or_a_moved_file_stops_the_run() -> None:
    renamed = types.ModuleType("test_openapi")  # collected, without the test the table names
    with pytest.raises(pytest.UsageError, match="test_the_agent_serves_the_document"):
        check_table({"agent/api/test_openapi.py": renamed})
    check_table({})  # every file the table names exists


def test_the_running_tests_carry_their_marks(request: pytest.FixtureRequest) -> None:
    """This test uses no tier fixture and is in no listed folder: make check runs it."""
    assert not {m.name for m in request.node.iter_markers()} & {"e2e", "bench", "external"}
