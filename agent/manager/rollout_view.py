"""The fleet dashboard's view of the manager's rollouts file (`agent.manager.rollout_store`).

`StoreRollouts(path)` is a `RolloutSource` (agent.manager.dashboard): each poll opens the file
read-only (`mode=ro`: it never creates it, never writes, takes no write lock), reads the newest
rollouts in one query and closes it. Under WAL a reader does not block the driver writing, and
the driver does not block it; a short busy timeout keeps a poll from hanging on a checkpoint.
A file that does not exist yet means "no rollouts".

`rollout_json` maps one stored state (`Rollout.to_json`) to the dashboard's shape: pure.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agent.manager.rollout_gate import parse_gate
from agent.manager.rollout_plan import DONE, wave_size

__all__ = ["StoreRollouts", "device_progress", "rollout_json"]

_BUSY_MS = 200
#: A device's rollback, as shown in place of its job state once it has one.
_ROLLBACK = {
    "queued": "rolling_back",
    "in_progress": "rolling_back",
    "succeeded": "rolled_back",
    "failed": "rollback_failed",
    "timed_out": "rollback_timed_out",
}


class StoreRollouts:
    """The newest `limit` rollouts of a rollouts file, read-only (see module docstring)."""

    def __init__(self, path: Path, limit: int = 5) -> None:
        self.path = path
        self.limit = limit

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection | None]:
        if not self.path.exists():
            yield None
            return
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_MS / 1000, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
            yield conn
        finally:
            conn.close()

    def _states(self) -> list[dict[str, Any]]:
        with self._connect() as conn:
            if conn is None:
                return []
            try:
                rows = conn.execute(
                    "SELECT state FROM rollouts ORDER BY created DESC, rowid DESC LIMIT ?",
                    [self.limit],
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # the manager is creating the file
                    return []
                raise
        return [json.loads(row[0]) for row in rows]

    def rollouts(self) -> list[dict[str, Any]]:
        """The newest rollouts first, in the dashboard's shape."""
        return [rollout_json(state) for state in self._states()]

    def groups(self) -> dict[str, list[str]]:
        """Nothing beyond what devices report in their status (the store keeps no groups)."""
        return {}


def device_progress(job: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """A device's job state in its wave ("pending": not started) and its rollback's, if any."""
    if job is None:
        return "pending", None
    rollback = job.get("rollback")
    shown = None if rollback is None else _ROLLBACK.get(str(rollback), str(rollback))
    return str(job.get("state") or "queued"), shown


def _wave_state(index: int, current: int, phase: str) -> str:
    if index < current or (index == current and phase == "succeeded"):
        return "done"
    if index > current:
        return "not_run" if phase in DONE or phase == "rolling_back" else "pending"
    return phase  # running, soaking, paused, rolling_back, aborted


def _gate(
    index: int, state: Mapping[str, Any], limits: dict[str, float], wave_state: str
) -> dict[str, Any] | None:
    figures_of = state.get("wave_figures") or []
    judged = figures_of[index].get("gate") if index < len(figures_of) else None
    if judged is None:
        verdict = {"soaking": "soaking", "pending": "waiting", "running": "waiting"}.get(
            wave_state, "not_judged"
        )
        if not limits and verdict != "soaking":
            return None
        return {"verdict": verdict, "figures": {}, "limits": limits}
    values = dict(judged.get("values") or {})
    breached = str(state.get("reason") or "").startswith("gate breached")
    failed = index == state.get("wave") and breached
    return {
        "verdict": "fail" if failed else "pass",
        "figures": values,
        "limits": limits,
        "candidate": judged.get("candidate"),
        "baseline": judged.get("baseline"),
    }


def rollout_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """One stored rollout state as the dashboard shows it (docs/pages.md)."""
    spec = state["spec"]
    phase = str(state["phase"])
    current = int(state["wave"])
    targets = list(state["targets"])
    jobs: Mapping[str, Mapping[str, Any]] = state.get("jobs") or {}
    limits = {rule.metric: rule.limit for rule in parse_gate(spec.get("gate") or "")}
    waves = []
    before = 0
    for index, share in enumerate(spec["waves"]):
        cut = wave_size(float(share), len(targets))
        members = targets[before:cut]
        before = cut
        wave_state = _wave_state(index, current, phase)
        progress = {d: device_progress(jobs.get(d)) for d in members}
        waves.append(
            {
                "name": f"wave {index + 1} ({round(float(share) * 100):g}%)",
                "state": wave_state,
                "devices": {d: job for d, (job, _rb) in progress.items()},
                "rollback": {d: rb for d, (_job, rb) in progress.items() if rb is not None},
                "details": {
                    d: str(j["detail"]) for d in members if (j := jobs.get(d, {})).get("detail")
                },
                "gate": _gate(index, state, limits, wave_state),
            }
        )
    return {
        "id": spec["id"],
        "model": spec["model"],
        "version": spec["version"],
        "group": spec["group"],
        "state": phase,
        "reason": state.get("reason") or "",
        "wave": current + 1,
        "devices": len(targets),
        "soak_s": spec.get("soak_s"),
        "started_at": state.get("started_at"),
        "finished_at": state.get("finished_at"),
        "waves": waves,
    }
