"""The fleet manager's view of its devices, read from their retained status. Pure: no I/O.

`DeviceView.from_status(doc)` reads one status document (docs/mqtt.md); fields a device did not
send (an older agent, an `offline` last will) are empty, never an error. `Fleet` keeps the
newest view per device: an `offline` will keeps what the device said before it went away
(groups and versions), with `online` False.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


def _str_list(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device as its retained status shows it.

    Attributes:
        device: The device id.
        state: `online`, `degraded` or `offline`.
        groups: The device's `[mqtt] groups`.
        served: model -> versions served now.
        agent_version: The agent's version ("" when not said).
        inventory: The device facts (`inventory` of the status).
        ts: When the status was published (Unix seconds).
        doc: The whole status document.
    """

    device: str
    state: str
    groups: tuple[str, ...] = ()
    served: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    agent_version: str = ""
    inventory: Mapping[str, Any] = field(default_factory=dict)
    ts: float = 0.0
    doc: Mapping[str, Any] = field(default_factory=dict)

    @property
    def online(self) -> bool:
        """Whether the device is connected (`degraded` still serves and takes commands)."""
        return self.state in ("online", "degraded")

    def versions(self, model: str) -> tuple[int, ...]:
        """The versions of `model` served now (empty: not served)."""
        return self.served.get(model, ())

    @classmethod
    def from_status(cls, doc: Mapping[str, Any]) -> DeviceView | None:
        """A view of a status document; None when it is not one."""
        device = doc.get("device")
        if doc.get("kind") != "status" or not isinstance(device, str) or not device:
            return None
        served: dict[str, tuple[int, ...]] = {}
        for entry in doc.get("models") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                versions = entry.get("versions")
                if isinstance(versions, list):
                    served[entry["name"]] = tuple(
                        v for v in versions if isinstance(v, int) and not isinstance(v, bool)
                    )
        inventory = doc.get("inventory")
        ts = doc.get("ts")
        return cls(
            device=device,
            state=str(doc.get("state") or "unknown"),
            groups=_str_list(doc.get("groups")),
            served=served,
            agent_version=str(doc.get("agent_version") or ""),
            inventory=inventory if isinstance(inventory, dict) else {},
            ts=float(ts) if isinstance(ts, (int, float)) else 0.0,
            doc=dict(doc),
        )


class Fleet:
    """The newest view of every device seen (see module docstring)."""

    def __init__(self) -> None:
        self.devices: dict[str, DeviceView] = {}

    def update(self, doc: Mapping[str, Any]) -> DeviceView | None:
        """Take a status document; returns the device's new view (None: not a status)."""
        view = DeviceView.from_status(doc)
        if view is None:
            return None
        before = self.devices.get(view.device)
        if before is not None and not view.online and "models" not in doc:
            # The last will / clean-stop status says only "offline": keep what was known.
            view = replace(before, state=view.state, ts=view.ts, doc=view.doc)
        self.devices[view.device] = view
        return view

    def in_group(self, group: str | None) -> list[DeviceView]:
        """Devices in `group` (None or "*": all), sorted by id."""
        return sorted(
            (d for d in self.devices.values() if group in (None, "*") or group in d.groups),
            key=lambda d: d.device,
        )


def inventory_rows(devices: Iterable[DeviceView]) -> list[dict[str, Any]]:
    """The `fleet inventory` JSON: one object per device."""
    return [
        {
            "device": d.device,
            "state": d.state,
            "groups": list(d.groups),
            "agent_version": d.agent_version,
            "models": {m: list(v) for m, v in sorted(d.served.items())},
            "served": d.doc.get("served") or [],
            "inventory": dict(d.inventory),
        }
        for d in devices
    ]


def inventory_table(devices: Iterable[DeviceView]) -> str:
    """The `fleet inventory` table: device, state, groups, agent, runtime, memory, models."""
    header = ("DEVICE", "STATE", "GROUPS", "AGENT", "ONNXRUNTIME", "MEMORY", "MODELS")
    rows = [header]
    for d in devices:
        packages = d.inventory.get("packages") or {}
        runtime = packages.get("onnxruntime-gpu") or packages.get("onnxruntime") or "-"
        memory = d.inventory.get("memory_bytes")
        models = " ".join(
            f"{m}:{','.join(map(str, v)) or '-'}" for m, v in sorted(d.served.items())
        )
        rows.append(
            (
                d.device,
                d.state,
                ",".join(d.groups) or "-",
                d.agent_version or "-",
                str(runtime),
                f"{memory / 2**30:.1f}GiB" if isinstance(memory, int) else "-",
                models or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
