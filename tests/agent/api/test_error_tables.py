"""Every AgentError maps to a code in each transport's one table, through the one shared lookup."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping

import pytest

import agent
from agent.api.grpc import service as grpc_server
from agent.api.grpc.status import Status
from agent.api.http import errors as http
from agent.errors import (
    AgentError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    ModelLoadError,
    lookup,
)
from agent.fleet import executor

TABLES: dict[str, Mapping[type[AgentError], object]] = {
    "http": http.STATUS_FOR_ERROR,
    "grpc": grpc_server.STATUS_FOR_ERROR,
    "mqtt": executor.ERROR_CODES,
}
# A transport's own errors (defined in its package) are raised by it only; the layering contract
# keeps the other transports from even importing them. They are checked in their own table.
OWNER = {"agent.api": ("http", "grpc"), "agent.fleet": ("mqtt",)}


def _subclasses(cls: type[AgentError]) -> Iterator[type[AgentError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def agent_errors() -> list[type[AgentError]]:
    """`AgentError` and every subclass the agent defines (all its modules imported first)."""
    for info in pkgutil.walk_packages(agent.__path__, "agent."):
        if info.name != "agent.__main__":
            importlib.import_module(info.name)
    found = {c for c in _subclasses(AgentError) if c.__module__.startswith("agent.")}
    return [AgentError, *sorted(found, key=lambda c: (c.__module__, c.__qualname__))]


def tables_for(cls: type[AgentError]) -> list[str]:
    for package, owners in OWNER.items():
        if cls.__module__.startswith(package + "."):
            return list(owners)
    return list(TABLES)


ERRORS = agent_errors()


def test_the_walk_finds_the_whole_tree() -> None:
    names = {c.__name__ for c in ERRORS}
    assert {"ModelInstanceFailedError", "MemoryBudgetError", "InternalError"} <= names
    assert {"CommandError", "CommandTooLargeError"} <= names  # defined in agent.fleet.commands


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__qualname__)
def test_every_agent_error_is_mapped_explicitly_in_each_table(cls: type[AgentError]) -> None:
    for transport in tables_for(cls):
        table = TABLES[transport]
        assert cls in table, f"{cls.__qualname__} has no row in the {transport} table"
        assert lookup(table, cls("x")) == table[cls]


def test_transport_functions_go_through_the_lookup() -> None:
    for cls in ERRORS:
        error = cls("x")
        if "http" in tables_for(cls):
            assert http.status_for(error) == http.STATUS_FOR_ERROR[cls]
            assert grpc_server.status_for(error) == grpc_server.STATUS_FOR_ERROR[cls]
        if "mqtt" in tables_for(cls):
            assert executor.error_code(error) == executor.ERROR_CODES[cls]


def test_unexpected_exceptions_map_as_internal_errors() -> None:
    boom = RuntimeError("boom")
    assert http.status_for(boom) == 500
    assert grpc_server.status_for(boom) is Status.INTERNAL
    assert executor.error_code(boom) == "internal"
    wrapped = InternalError.wrap(boom)
    assert isinstance(wrapped, InternalError)
    assert wrapped.message == "internal error: RuntimeError: boom"
    kept = InvalidInputError("bad")
    assert InternalError.wrap(kept) is kept


def test_lookup_walks_the_mro_to_the_nearest_listed_base() -> None:
    table = {AgentError: "base", ModelLoadError: "load"}
    assert lookup(table, MemoryBudgetError("x")) == "load"
    assert lookup(table, InvalidInputError("x")) == "base"
    assert lookup(table, KeyError("x")) == "base"  # as InternalError, then its base
    with pytest.raises(KeyError, match="no code for InternalError"):
        lookup({ModelLoadError: 1}, ValueError("x"))
