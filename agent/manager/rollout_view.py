"""The fleet dashboard's view of the manager's rollouts file (`agent.manager.rollout_store`).

`StoreRollouts(path)` is a `RolloutSource` (agent.manager.dashboard): each poll opens the file
read-only (`mode=ro`: it never creates it, never writes, takes no write lock), reads the newest
rollouts in one query and closes it. Under WAL a reader does not block the driver writing, and
the driver does not block it; a short busy timeout keeps a poll from hanging on a checkpoint.
A file that does not exist yet means "no rollouts".

Polls are cheap when nothing changed: one query reads each rollout's `updated` stamp, and only a
rollout stored since the last poll is read and decoded again (a 10,000-device rollout is 2.9 MB
of JSON).

`rollout_json` maps one stored state (`Rollout.to_json`) to the dashboard's shape: pure. A wave
of more than `WAVE_LIST` devices lists only the devices worth a look (a job not succeeded, a
rollback not rolled back), at most `WAVE_LIST` of them, with the count of every job and rollback
state and how many devices are not listed (`more`).
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

__all__ = ["WAVE_LIST", "StoreRollouts", "device_progress", "rollout_json"]

_BUSY_MS = 200
WAVE_LIST = 50  # devices a wave lists one by one
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
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}  # id -> (updated, shape)

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

    def rollouts(self) -> list[dict[str, Any]]:
        """The newest rollouts first, in the dashboard's shape."""
        with self._connect() as conn:
            if conn is None:
                return []
            try:
                stamps = conn.execute(
                    "SELECT id, updated FROM rollouts ORDER BY created DESC, rowid DESC LIMIT ?",
                    [self.limit],
                ).fetchall()
                for rollout_id, updated in stamps:
                    cached = self._cache.get(rollout_id)
                    if cached is None or cached[0] != updated:
                        row = conn.execute(
                            "SELECT state FROM rollouts WHERE id = ?", [rollout_id]
                        ).fetchone()
                        if row is not None:
                            self._cache[rollout_id] = (updated, rollout_json(json.loads(row[0])))
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # the manager is creating the file
                    return []
                raise
        ids = [rollout_id for rollout_id, _updated in stamps]
        self._cache = {i: self._cache[i] for i in ids if i in self._cache}
        return [self._cache[i][1] for i in ids if i in self._cache]

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


def _listed(
    progress: Mapping[str, tuple[str, str | None]], limit: int
) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """The devices a wave lists, and the count of each job and rollback state."""
    counts: dict[str, int] = {}
    rollbacks: dict[str, int] = {}
    for job, rollback in progress.values():
        counts[job] = counts.get(job, 0) + 1
        if rollback is not None:
            rollbacks[rollback] = rollbacks.get(rollback, 0) + 1
    if len(progress) <= limit:
        return list(progress), counts, rollbacks
    notable = [
        d
        for d, (job, rollback) in progress.items()
        if job not in ("succeeded", "pending") or rollback not in (None, "rolled_back")
    ]
    return notable[:limit], counts, rollbacks


def rollout_json(state: Mapping[str, Any], wave_list: int = WAVE_LIST) -> dict[str, Any]:
    """One stored rollout state as the dashboard shows it (docs/pages.md); a wave of more than
    `wave_list` devices lists only those worth a look (see module docstring)."""
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
        listed, counts, rollbacks = _listed(progress, wave_list)
        waves.append(
            {
                "name": f"wave {index + 1} ({round(float(share) * 100):g}%)",
                "state": wave_state,
                "size": len(members),
                "counts": counts,
                "rollback_counts": rollbacks,
                "more": len(members) - len(listed),
                "devices": {d: progress[d][0] for d in listed},
                "rollback": {d: rb for d in listed if (rb := progress[d][1]) is not None},
                "details": {
                    d: str(j["detail"]) for d in listed if (j := jobs.get(d, {})).get("detail")
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
