"""The environment layer of the config: `EDGE_AGENT_<SECTION>_<KEY>` variables.

`EDGE_AGENT_SERVER_HTTP_PORT=9000` sets `server.http_port`. Text is parsed by the key's type here;
type checks and path resolution are the loader's, the same as for the file's values.

Invariants:

* Sections and keys come from `AgentConfig` itself, so a new section or key is overridable
  without touching this module.
* A variable whose first word names no section (`EDGE_AGENT_STALL_ON_SIGUSR1`) is not config and
  is ignored; one that names a section but no key of it is an error naming the variable.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from agent.config.schema import config_sections
from agent.errors import AgentConfigError

ENV_PREFIX = "EDGE_AGENT_"
_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `EDGE_AGENT_<SECTION>_<KEY>` variables as `section.key` values, parsed by the key's type.

    `EDGE_AGENT_SERVER_HTTP_PORT=9000` gives `{"server.http_port": 9000}`. Values convert by the
    key's type: integers and floats as written, booleans as true/false/1/0/yes/no/on/off, string
    lists as a TOML array (`["a", "b"]`) or comma-separated, paths as given (relative to the
    working directory, as on the command line). An empty value for an optional path is ignored
    (the file's value stands): the loader treats None as "not overridden". The loader then
    checks and converts these values like the file's (`agent.config.loader`).

    Args:
        environ: the environment (pass `os.environ`).

    Raises:
        AgentConfigError: a variable names a section but no key of it, or its value does not
            convert; the message names the variable and the key.

    Returns:
        The overrides, keyed `section.key`.
    """
    sections = config_sections()
    overrides: dict[str, Any] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section == "canary":
            raise AgentConfigError(
                f"environment variable {name}: [canary.MODEL] tables are set in the config file"
            )
        cls = sections.get(section)
        if cls is None:
            continue  # not a config variable (e.g. a test hook)
        hints = get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        if key not in known:
            raise AgentConfigError(
                f"environment variable {name}: unknown config key '{section}.{key}' "
                f"(known in [{section}]: {', '.join(sorted(known))})"
            )
        value = _convert(name, f"{section}.{key}", hints[key], environ[name])
        if value is not None:
            overrides[f"{section}.{key}"] = value
    return overrides


def _convert(var: str, key: str, hint: Any, text: str) -> Any:
    where = f"environment variable {var}: config key '{key}'"
    optional = _is_optional(hint)
    base = _strip_optional(hint)
    if optional and text == "":
        return None
    if base is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise AgentConfigError(f"{where} must be true or false, got {text!r}")
    if base is int:
        try:
            return int(text.strip().replace("_", ""), 10)
        except ValueError:
            raise AgentConfigError(f"{where} must be an integer, got {text!r}") from None
    if base is float:
        try:
            return float(text)
        except ValueError:
            raise AgentConfigError(f"{where} must be a number, got {text!r}") from None
    if base is str or (isinstance(base, type) and issubclass(base, enum.Enum)):
        return text  # a closed choice is parsed by the loader, as the file's value is
    if base is Path:
        if not text:
            raise AgentConfigError(f"{where} must be a path, got ''")
        return text  # resolved against the working directory by the loader
    if base == tuple[str, ...]:
        return _string_list(where, text)
    raise AgentConfigError(f"{where} cannot be set from the environment")  # pragma: no cover


def _string_list(where: str, text: str) -> tuple[str, ...]:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = tomllib.loads(f"v = {stripped}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise AgentConfigError(f"{where} must be a list of strings: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise AgentConfigError(f"{where} must be a list of strings, got {text!r}")
        return tuple(value)
    return tuple(part.strip() for part in stripped.split(",") if part.strip())


def _is_optional(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def _strip_optional(hint: Any) -> Any:
    if not _is_optional(hint):
        return hint
    rest = [a for a in get_args(hint) if a is not type(None)]
    return rest[0] if len(rest) == 1 else hint
