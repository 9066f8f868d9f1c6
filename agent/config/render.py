"""The effective config as TOML (for `config show`): secrets masked, read back by the loader.

Invariant: `render_toml` never prints a secret: string values of keys named like a password,
token, secret or key material are masked, and so are the password in a URL's user-info and the
header value of a restricted API spec.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import urllib.parse
from pathlib import Path
from typing import Any

from agent.config.schema import AgentConfig, config_sections

MASK = "********"

_SECRET = re.compile(
    r"(password|passwd|passphrase|secret|token|credential|api_?key|access_?key|private_?key|_key$|^key$)",
    re.IGNORECASE,
)


# Triton's restricted API specs "<group>,...:<key>=<value>": the value is a credential.
_RESTRICTION_SUFFIXES = ("_restricted_api", "_restricted_protocol")


def mask_restriction(spec: str) -> str:
    """`groups:key=value` → `groups:key=********` (the header name stays readable)."""
    head, sep, _ = spec.partition("=")
    return head + sep + MASK if sep else spec


def is_secret_key(name: str) -> bool:
    """Whether a config key holds a secret (password, token, secret, key material)."""
    return bool(_SECRET.search(name))


def render_toml(config: AgentConfig) -> str:
    """The config as TOML that `load_config` reads back (secrets masked; unset paths commented).

    Returns:
        One `[section]` table per section, keys in declaration order.
    """
    lines: list[str] = []
    sections = config_sections()
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
            if field.name.endswith(_RESTRICTION_SUFFIXES):
                item = tuple(mask_restriction(spec) for spec in item)
            lines.append(f"{field.name} = {_toml_value(field.name, item)}")
    for model, policy in config.canary:
        lines += ["", f"[canary.{_toml_string(model)}]"]
        lines += [f"{k} = {_toml_value(k, v)}" for k, v in policy.as_json().items()]
    return "\n".join(lines) + "\n"


def _toml_value(key: str, value: Any) -> str:
    if isinstance(value, enum.Enum):  # a closed choice: its TOML spelling
        return _toml_string(str(value.value))
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
