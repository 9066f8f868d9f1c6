"""The topic layout of the fleet protocol (docs/mqtt.md): `{prefix}/{device}/status|telemetry|
events|commands|responses`, and the fleet-wide rebirth topic. The device publishes on its own
topics; the manager subscribes to them with wildcards and sends commands to `commands`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Topics"]


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics of one device."""

    prefix: str
    device: str

    def _leaf(self, leaf: str) -> str:
        return f"{self.prefix}/{self.device}/{leaf}"

    @property
    def status(self) -> str:
        """Retained status; also the last will's topic."""
        return self._leaf("status")

    @property
    def telemetry(self) -> str:
        """Periodic telemetry."""
        return self._leaf("telemetry")

    @property
    def events(self) -> str:
        """Model events and SLO/drift alerts."""
        return self._leaf("events")

    @property
    def commands(self) -> str:
        """Commands to the device."""
        return self._leaf("commands")

    @property
    def responses(self) -> str:
        """Default topic of command responses."""
        return self._leaf("responses")

    @property
    def rebirth_all(self) -> str:
        """Fleet-wide: any message here makes every device re-publish its status."""
        return f"{self.prefix}/_fleet/rebirth"

    def reply_topic(self, requested: str | None) -> str:
        """Where a command's response goes: the MQTT 5 response topic it asked for, unless that
        is no plain topic name or one of this device's own topics; else `responses`."""
        own = {self.status, self.telemetry, self.events, self.commands}
        if (
            requested
            and len(requested) <= 256
            and not any(c in requested for c in "+#\0")
            and not requested.startswith("$")
            and requested not in own
        ):
            return requested
        return self.responses
