"""Which MQTT version a client speaks (`mqtt.protocol`; the fleet CLI's `--protocol`): a module
of its own, so that the config can name the choice without importing paho-mqtt."""

from __future__ import annotations

import enum

__all__ = ["Protocol"]


class Protocol(str, enum.Enum):
    """Which MQTT version to speak."""

    AUTO = "auto"  # 5, falling back to 3.1.1
    V5 = "5"
    V311 = "3.1.1"
