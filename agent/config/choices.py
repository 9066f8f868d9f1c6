"""The settings that take one of a closed set of values, as enums whose values are their TOML
spellings (the same in the file, in `EDGE_AGENT_*` variables and on the command line).

The loader parses each once, whatever layer it comes from (`agent.config.loader`), and refuses
anything else naming the key and the values allowed; the code then compares members:

    server.grpc_engine    GrpcEngine         loop | grpcio
    log.level             LogLevel           debug | info | warning | error | critical (any case)
    log.trace_mode        TraceMode          triton | opentelemetry
    models.control_mode   ModelControlMode   none | poll | explicit  (agent.models.control_mode)
    mqtt.protocol         Protocol           auto | 5 | 3.1.1        (agent.wire.mqtt_version)

The last two live beside the code that acts on them, below the config in the layering, and
are the config's types too.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import TypeVar

from agent.errors import AgentConfigError
from agent.models.control_mode import ModelControlMode
from agent.wire.mqtt_version import Protocol

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        """`enum.StrEnum` (3.11): members are their values, also in `str()` and `%s`."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = [
    "GrpcEngine",
    "LogLevel",
    "ModelControlMode",
    "Protocol",
    "TraceMode",
    "allowed",
    "parse_choice",
]

E = TypeVar("E", bound=Enum)


class GrpcEngine(StrEnum):
    """Which server answers gRPC."""

    LOOP = "loop"  # HTTP/2 on the event loop (agent.api.grpc.loop)
    GRPCIO = "grpcio"  # grpc.aio


class LogLevel(StrEnum):
    """The agent's log level (Python's level names, in any case)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        if isinstance(value, str) and value.lower() != value:
            return cls(value.lower())  # "INFO", as logging spells it
        return None


class TraceMode(StrEnum):
    """Where request traces go."""

    TRITON = "triton"  # Triton's trace JSON file
    OPENTELEMETRY = "opentelemetry"  # spans over OTLP/HTTP


def allowed(choice: type[Enum]) -> str:
    """The values a setting of this type takes, for messages: `loop, grpcio`."""
    return ", ".join(str(member.value) for member in choice)


def parse_choice(key: str, choice: type[E], value: object) -> E:
    """The member a setting's value spells (a member stays itself).

    The loader parses every layer's value with this; the sections' dataclasses call it too, so
    a config built in code from a spelling holds the member as well.

    Raises:
        AgentConfigError: not one of the values allowed, naming `key` and those values.
    """
    if isinstance(value, choice):
        return value
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return choice(value)
    except ValueError:
        raise AgentConfigError(
            f"config key '{key}' must be one of {allowed(choice)}, got {value!r}"
        ) from None
