"""gRPC status codes come from one enum: `agent.api.grpc.status.Status`.

grpcio's `grpc.StatusCode` is the reference for the values; the grpc.aio engine maps to it at its
edge. An AST check holds agent/api/grpc to the rule: no bare status integer (a constant named for
a code, or an integer passed where a status goes), and grpcio's enum only in the grpc.aio engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest

from agent.api.grpc import aio
from agent.api.grpc.status import Status

GRPC_PACKAGE = Path(aio.__file__).parent
# Calls that take a status, and the position of it among their arguments.
STATUS_ARGUMENT = {
    "StatusError": 0,
    "trailers_block": 0,
    "finish": 1,
    "_complete": 1,
    "_end": 1,
    "_refuse": 1,
}


def test_the_enum_is_grpc_s_code_list() -> None:
    assert {s.name: s.value for s in Status} == {c.name: c.value[0] for c in grpc.StatusCode}
    for status in Status:
        assert aio.grpcio_code(status).value[0] == status


def bare_status_integers(source: str, filename: str) -> list[str]:
    """Where `source` spells a gRPC status as an integer ("file:line what")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [
                name.id
                for target in targets
                for name in (target.elts if isinstance(target, ast.Tuple) else [target])
                if isinstance(name, ast.Name)
            ]
            value = node.value
            ints = value is not None and any(
                isinstance(c, ast.Constant) and type(c.value) is int for c in ast.walk(value)
            )
            for name in names:
                if name.strip("_") in Status.__members__ and ints:
                    found.append(f"{filename}:{node.lineno} {name} = an integer")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            index = STATUS_ARGUMENT.get(called)
            if index is not None and len(node.args) > index:
                arg = node.args[index]
                if isinstance(arg, ast.Constant) and type(arg.value) is int:
                    found.append(f"{filename}:{node.lineno} {called}(... {arg.value} ...)")
        elif isinstance(node, ast.Attribute) and node.attr == "StatusCode" and filename != "aio.py":
            found.append(f"{filename}:{node.lineno} grpc.StatusCode outside the grpc.aio engine")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("_INTERNAL = 13", 1),
        ("_CANCELLED, _UNKNOWN = 1, 2", 2),
        ("conn.finish(sid, 13, 'x')", 1),
        ("raise StatusError(8, 'too large')", 1),
        ("code = grpc.StatusCode.INTERNAL", 1),
        ("conn.finish(sid, Status.INTERNAL, 'x'); OUR_WINDOW = 16", 0),
    ],
)
def test_the_check_finds_bare_status_integers(source: str, expected: int) -> None:
    assert len(bare_status_integers(source, "x.py")) == expected


def test_no_bare_status_integer_in_the_grpc_package() -> None:
    modules = [p for p in sorted(GRPC_PACKAGE.rglob("*.py")) if p.name != "status.py"]
    assert len(modules) >= 10  # the servicer, the codecs, both engines
    found = [line for path in modules for line in bare_status_integers(path.read_text(), path.name)]
    assert found == []
