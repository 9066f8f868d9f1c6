"""The one way every command reads its configuration: file, environment, flags.

    config = load_config(Path("/etc/edge-agent/agent.toml"), flags, os.environ)

Precedence, lowest first: the dataclass defaults, the TOML file, `EDGE_AGENT_<SECTION>_<KEY>`
environment variables, command-line flags. `serve`, `sync --once`, `config check` and
`config show` all come through here, so an override works the same for each of them.

Invariants:

* Every value, whichever layer it comes from, passes through one coercion (`_coerce`): the same
  type checks, the same messages naming the key, the same path rule.
* Relative paths in the file are relative to the file's folder; from the environment or a flag,
  relative to the working directory (as a shell user expects).
* A closed choice (an `Enum` key: `agent.config.choices`) becomes its member here, once; any
  other value is an `AgentConfigError` naming the key and the values allowed.
* An unknown section or key, or a value of the wrong type, is an `AgentConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from agent.canary.policy import CanaryPolicy, CanaryPolicyError, parse_policy
from agent.config.choices import parse_choice
from agent.config.environment import env_values
from agent.config.schema import AgentConfig, config_sections, validate
from agent.errors import AgentConfigError

__all__ = ["load_config"]


def load_config(
    path: Path | None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    serving: bool = True,
) -> AgentConfig:
    """Read the file (if any), then the environment, then the flags, and validate the result.

    Args:
        path: the TOML file; None: defaults only.
        flags: `section.key` values from the command line; None values mean "not given".
        environ: the environment (`os.environ`); None: no environment layer.
        serving: also check what `serve` needs (a repository); off for `sync --once`.

    Raises:
        AgentConfigError: unreadable file, bad TOML, unknown key, wrong type or invalid value.

    Returns:
        The validated configuration.
    """
    doc, base = _read_file(path)
    sections = config_sections()
    for key in doc:
        if key not in sections and key != "canary":
            raise AgentConfigError(
                f"unknown config section [{key}] (known: {', '.join(sections)}, canary)"
            )
    values: dict[str, dict[str, Any]] = {}
    for name, cls in sections.items():
        raw = doc.get(name, {})
        if not isinstance(raw, dict):
            raise AgentConfigError(f"config key '{name}' must be a table [{name}]")
        values[name] = {k: _coerce_known(name, cls, k, v, base, "config") for k, v in raw.items()}
    cwd = Path.cwd()
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if environ is not None:
        layers.append(("environment variable", env_values(environ)))
    if flags:
        layers.append(("flag", flags))
    for origin, layer in layers:
        for dotted, value in layer.items():
            if value is None:
                continue  # not given: the lower layer stands
            section, _, key = dotted.partition(".")
            if section not in sections:
                raise AgentConfigError(f"{origin} sets unknown config key '{dotted}'")
            values[section][key] = _coerce_known(
                section, sections[section], key, value, cwd, origin
            )
    config = AgentConfig(
        **{name: cls(**values[name]) for name, cls in sections.items()},
        canary=_canaries(doc.get("canary", {})),
    )
    validate(config, serving=serving)
    return config


def _read_file(path: Path | None) -> tuple[dict[str, Any], Path]:
    if path is None:
        return {}, Path.cwd()
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), path.parent
    except OSError as exc:
        raise AgentConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AgentConfigError(f"{path}: invalid TOML: {exc}") from None


def _coerce_known(
    section: str, cls: type[Any], key: str, value: Any, base: Path, origin: str
) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    if key not in known:
        where = "" if origin == "config" else f" ({origin})"
        raise AgentConfigError(
            f"unknown config key '{section}.{key}'{where} "
            f"(known in [{section}]: {', '.join(sorted(known))})"
        )
    return _coerce(f"{section}.{key}", get_type_hints(cls)[key], value, base)


def _coerce(key: str, hint: Any, value: Any, base: Path) -> Any:
    """The one type check and conversion every layer's values go through."""
    if hint is bool:
        if not isinstance(value, bool):
            raise AgentConfigError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise AgentConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise AgentConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return parse_choice(key, hint, value)
    if hint == tuple[str, ...]:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise AgentConfigError(f"config key '{key}' must be a list of strings, got {value!r}")
        return tuple(value)
    # Path | None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise AgentConfigError(f"config key '{key}' must be a path string, got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _canaries(raw: Any) -> tuple[tuple[str, CanaryPolicy], ...]:
    """The `[canary.MODEL]` tables."""
    if not isinstance(raw, dict):
        raise AgentConfigError("config key 'canary' must hold tables [canary.MODEL]")
    policies: list[tuple[str, CanaryPolicy]] = []
    for model, table in sorted(raw.items()):
        if not isinstance(table, dict):
            raise AgentConfigError(f"config key 'canary.{model}' must be a table [canary.{model}]")
        try:
            policies.append((model, parse_policy(table)))
        except CanaryPolicyError as exc:
            raise AgentConfigError(
                f"config key 'canary.{model}.{exc.key}': {exc.message}"
            ) from None
    return tuple(policies)
