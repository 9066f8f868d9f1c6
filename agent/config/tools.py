"""Config beyond loading: environment overrides, `config check` and `config show`.

Precedence, lowest first: the dataclass defaults, the TOML file, `EDGE_AGENT_<SECTION>_<KEY>`
environment variables, command-line flags. `env_overrides` returns the environment's layer as
`section.key` overrides in the same typed form the flags produce, for `load_config` to apply.

Invariants:

* Sections and keys come from `AgentConfig` itself, so a new section or key is overridable
  without touching this module.
* A variable whose first word names no section (`EDGE_AGENT_STALL_ON_SIGUSR1`) is not config and
  is ignored; one that names a section but no key of it is an error naming the variable.
* `render_toml` never prints a secret: string values of keys named like a password, token,
  secret or key material are masked, and so is the password in a URL's user-info.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from agent.config.schema import AgentConfig, load_config
from agent.errors import AgentConfigError

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ENV_PREFIX",
    "MASK",
    "check_command",
    "env_overrides",
    "is_secret_key",
    "load_with_env",
    "render_toml",
    "show_command",
]

ENV_PREFIX = "EDGE_AGENT_"
DEFAULT_CONFIG_PATH = Path("/etc/edge-agent/agent.toml")
MASK = "********"
EXIT_OK = 0
EXIT_CONFIG = 2

_SECRET = re.compile(
    r"(password|passwd|passphrase|secret|token|credential|api_?key|access_?key|private_?key|_key$|^key$)",
    re.IGNORECASE,
)
_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))


def _sections() -> dict[str, type[Any]]:
    """`AgentConfig`'s sections: name → dataclass (`canary`, a table per model, is not one)."""
    hints = get_type_hints(AgentConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(AgentConfig)
        if dataclasses.is_dataclass(hints[f.name])
    }


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `EDGE_AGENT_<SECTION>_<KEY>` variables as typed `section.key` overrides.

    `EDGE_AGENT_SERVER_HTTP_PORT=9000` gives `{"server.http_port": 9000}`. Values convert by the
    key's type: integers and floats as written, booleans as true/false/1/0/yes/no/on/off, string
    lists as a TOML array (`["a", "b"]`) or comma-separated, paths as given (relative to the
    working directory, as on the command line). An empty value for an optional path is ignored
    (the file's value stands): `load_config` treats None as "not overridden".

    Args:
        environ: the environment (pass `os.environ`).

    Raises:
        AgentConfigError: a variable names a section but no key of it, or its value does not
            convert; the message names the variable and the key.

    Returns:
        The overrides, keyed `section.key`.
    """
    sections = _sections()
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
    if base is str:
        return text
    if base is Path:
        if not text:
            raise AgentConfigError(f"{where} must be a path, got ''")
        return Path(text).expanduser()
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


def load_with_env(
    path: Path | None, flags: Mapping[str, Any], environ: Mapping[str, str]
) -> AgentConfig:
    """`load_config` with the environment layer under the flags (flags win, then env, then file).

    Raises:
        AgentConfigError: as `load_config` and `env_overrides`.
    """
    merged = env_overrides(environ)
    merged.update({k: v for k, v in flags.items() if v is not None})
    return load_config(path, merged)


def check_command(path: Path, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """`edge-agent config check FILE`: validate a file as start-up would, without starting.

    The environment is not applied: the file is judged on its own.

    Returns:
        0 and `FILE: ok` on stdout, or 2 and one line on stderr naming the key and the problem.
    """
    try:
        load_config(path, {})
    except AgentConfigError as exc:
        print(f"edge-agent: error: {_one_line(str(exc))}", file=err)
        return EXIT_CONFIG
    print(f"{path}: ok", file=out)
    return EXIT_OK


def show_command(
    path: Path | None,
    environ: Mapping[str, str],
    *,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`edge-agent config show [--config FILE]`: the effective config as TOML, secrets masked.

    Without `--config`, `/etc/edge-agent/agent.toml` is read when it exists. Environment
    overrides apply.

    Returns:
        0 with the TOML on stdout, or 2 with one line on stderr naming the key and the problem.
    """
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    try:
        config = load_with_env(path, {}, environ)
    except AgentConfigError as exc:
        print(f"edge-agent: error: {_one_line(str(exc))}", file=err)
        return EXIT_CONFIG
    source = str(path) if path is not None else "defaults"
    out.write(f"# effective edge-agent config ({source} + environment); secrets masked\n")
    out.write(render_toml(config))
    return EXIT_OK


def is_secret_key(name: str) -> bool:
    """Whether a config key holds a secret (password, token, secret, key material)."""
    return bool(_SECRET.search(name))


def render_toml(config: AgentConfig) -> str:
    """The config as TOML that `load_config` reads back (secrets masked; unset paths commented).

    Returns:
        One `[section]` table per section, keys in declaration order.
    """
    lines: list[str] = []
    sections = _sections()
    for section in dataclasses.fields(AgentConfig):
        if section.name not in sections:
            continue
        value = getattr(config, section.name)
        if lines:
            lines.append("")
        lines.append(f"[{section.name}]")
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if item is None:
                lines.append(f"# {field.name} is not set")
                continue
            if isinstance(item, str) and item and is_secret_key(field.name):
                item = MASK
            lines.append(f"{field.name} = {_toml_value(field.name, item)}")
    for model, policy in config.canary:
        lines += ["", f"[canary.{_toml_string(model)}]"]
        lines += [f"{k} = {_toml_value(k, v)}" for k, v in policy.as_json().items()]
    return "\n".join(lines) + "\n"


def _toml_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Path):
        return _toml_string(str(value))
    if isinstance(value, str):
        return _toml_string(_mask_url(value))
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(key, v) for v in value) + "]"
    raise TypeError(f"config key {key!r}: cannot render {type(value).__name__} as TOML")


def _toml_string(text: str) -> str:
    escaped = []
    for ch in text:
        if ch == "\\":
            escaped.append("\\\\")
        elif ch == '"':
            escaped.append('\\"')
        elif ch == "\n":
            escaped.append("\\n")
        elif ch == "\t":
            escaped.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\u{ord(ch):04x}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def _mask_url(value: str) -> str:
    """`scheme://user:pass@host/...` → `scheme://user:********@host/...`; other text unchanged."""
    if "://" not in value or "@" not in value:
        return value
    parts = urllib.parse.urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":" + MASK
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def _one_line(text: str) -> str:
    return " ".join(text.split())
