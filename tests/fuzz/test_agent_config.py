"""The agent's TOML config, mutated: `config check` exits 2 with one line, never a traceback.

Seeds are a complete file (every section, as docs/configuration.md shows one) and the rendered
defaults. Text mutations (bytes deleted, inserted, lines repeated) and value mutations (any key
set to any TOML value, unknown keys and sections added) go through `edge-agent config check`, the
same `load_config` that `serve` runs at start. Property: exit 0, or exit 2 with exactly one line
on stderr; for a value mutation that fails, the line names the key.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import tomllib
from hypothesis import example, given
from hypothesis import strategies as st

from agent.config.tools import check_command
from tests.fuzz.budget import FUZZ

SEED = """
[server]
host = "127.0.0.1"
http_port = 8000
grpc_port = 8001
metrics_port = -1
max_request_bytes = 67108864
shared_memory = true

[models]
repository = "models"
strict_model_config = false
exit_on_error = true
intra_op_threads = 0
memory_budget_bytes = 0
max_queue_size = 1024
control_mode = "explicit"
load_models = ["*"]
poll_quiet_ms = 1000

[sync]
desired = ["*=latest", "resnet=3"]
interval_s = 300
jitter_s = 30

[mqtt]
port = 8883
slo = ["resnet:p95_ms=50,error_rate=0.001", "*:p99_ms=200"]

[canary.resnet]
version = 2
share = 0.1
promote_after = 1000
window = 100
max_error_rate = 0.05
"""

_TOML_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["", "*", "models", "/nonexistent", "none", "poll", "*=latest", "a=b"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=6,
)


def _quote(text: str) -> str:
    """A TOML basic string (JSON's escapes, and DEL, which TOML wants escaped too)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007F")


def _toml(value: Any) -> str:
    """A value as TOML (what a hand-edited file could hold)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_quote(k)} = {_toml(v)}" for k, v in value.items()) + "}"


def _render(doc: dict[str, Any]) -> str:
    """A document as TOML: every top-level value a table, `canary` as `[canary.MODEL]` tables."""
    plain: list[str] = []
    tables: list[str] = []
    for section, table in doc.items():
        if not isinstance(table, dict):
            plain.append(f"{_quote(section)} = {_toml(table)}")
            continue
        nested = section == "canary" and all(isinstance(v, dict) for v in table.values())
        for name, body in table.items() if nested else [(None, table)]:
            header = _quote(section) + ("" if name is None else "." + _quote(name))
            tables.append(f"[{header}]")
            tables += [f"{_quote(k)} = {_toml(v)}" for k, v in body.items()]
    return "\n".join(plain + tables) + "\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config")
    (root / "models").mkdir()
    return root


def _check(folder: Path, text: str) -> tuple[int, str]:
    path = folder / "agent.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    out, err = io.StringIO(), io.StringIO()
    code = check_command(path, out=out, err=err)
    if code == 0:
        assert err.getvalue() == ""
        return code, ""
    assert code == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, err.getvalue()
    assert lines[0].startswith("edge-agent: error: ")
    assert "Traceback" not in lines[0]
    return code, lines[0]


def test_the_seed_is_valid(folder: Path) -> None:
    assert _check(folder, SEED)[0] == 0


@FUZZ
@given(st.data())
def test_text_mutations_exit_2_with_one_line(folder: Path, data: st.DataObject) -> None:
    text = SEED
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["delete", "insert", "line"]))
        if kind == "delete":
            text = text[:at] + text[at + data.draw(st.integers(1, 10)) :]
        elif kind == "insert":
            piece = data.draw(
                st.text(max_size=5)
                | st.sampled_from(["[", "]", "=", '"', "\n[x]\n", "[[models]]\n", "{"])
            )
            text = text[:at] + piece + text[at:]
        else:
            lines = text.splitlines(keepends=True)
            i = data.draw(st.integers(0, len(lines) - 1))
            text = "".join([*lines[: i + 1], *lines[i:]])
    _check(folder, text)


@st.composite
def _value_mutation(draw: st.DrawFn) -> tuple[str, str, Any]:
    doc = tomllib.loads(SEED)
    section = draw(st.sampled_from([*doc, "nope"]))
    keys = [*doc.get(section, {}), "bogus"]
    key = draw(st.sampled_from(keys) | st.text(min_size=1, max_size=5))
    return section, key, draw(_TOML_VALUES)


@FUZZ
@given(_value_mutation())
@example(("models", "max_queue_size", -2))
@example(("server", "http_port", 2**40))
def test_value_mutations_exit_2_naming_the_key(folder: Path, case: tuple[str, str, Any]) -> None:
    section, key, value = case
    doc = tomllib.loads(SEED)
    doc.setdefault(section, {})[key] = value
    code, line = _check(folder, _render(doc))
    if code == 2:
        named = (section, key, repr(key)[1:-1])
        assert any(name in line for name in named), line
