"""A fleet rollout as a state machine: waves, device jobs, the gate, abort and roll back. Pure.

The driver (`agent.manager.rollout_driver`) feeds it what the broker brings and the time, and sends
what it asks for; nothing here does I/O, sleeps or reads a clock, so every decision is testable
without a broker (what it is given and sends, and the wave arithmetic, are in
`agent.manager.rollout_plan`):

    rollout = Rollout.start(spec, fleet.devices, now)
    rollout.on_response(device, command_id, response, now)   # a command's response
    rollout.on_telemetry(device, doc, now)                    # a telemetry message
    sends = rollout.step(fleet.devices, now)                  # what to send now
    rollout.take_events()                                     # decisions, with their figures

Invariants:
    * The targets are chosen once, at start: the devices of the group, ordered by a hash of
      rollout id and device id, so the order is fixed and spreads across sites. Wave `i` covers
      the first `ceil(share_i * n)` of them (at least one).
    * Each device has a job whose state is one of `JOB_STATES` (the job-execution states of
      fleet tooling): queued (not sent: not started or the device is offline), in_progress
      (sent), succeeded (the device serves the version), failed (the device answered with an
      error), rejected (the device refused the command as not applicable), timed_out.
    * Command ids are derived from rollout, device and step, so a resent command (after the
      manager restarts) is deduplicated by the device: at most once per device.
    * A wave ends when each of its online devices' jobs is final; a device still offline
      `job_timeout_s` after the wave began is reported `not_reached` and does not hold it (it
      gets the command if it comes back while the rollout runs). Then the soak: after `soak_s`
      the gate judges the telemetry of the devices on the new version against those still on
      the old one (`agent.manager.rollout_gate`).
    * More failed/timed-out/rejected jobs than `max_failed`, a gate breach, or an operator's
      abort, roll back every touched device (one that was sent the version) to the version it
      served before; the rollout ends `aborted` once each rollback is final or its device
      unreachable past `job_timeout_s`.
    * Every decision is an event with its figures; the state round-trips through JSON, so the
      driver stores it after every step and a new driver resumes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.manager.devices import DeviceView
from agent.manager.rollout_gate import DeviceWindow, judge, window_of
from agent.manager.rollout_plan import (
    BAD,
    DONE,
    FINAL,
    JOB_STATES,
    Job,
    RolloutSpec,
    Send,
    target_order,
    wave_size,
)

#: Error codes that mean "this device cannot take this command": the job is `rejected`.
_REFUSED = frozenset({"bad_command", "not_found", "not_allowed", "invalid_argument"})


@dataclass(slots=True)
class Rollout:
    """The state machine (see module docstring). Build with `start` or `from_json`."""

    spec: RolloutSpec
    targets: list[str]
    phase: str = "running"
    wave: int = 0
    started_at: float = 0.0
    wave_started_at: float = 0.0
    soak_started_at: float | None = None
    paused_from: str | None = None
    reason: str = ""
    aborted_at: float | None = None
    finished_at: float | None = None
    jobs: dict[str, Job] = field(default_factory=dict)
    windows: dict[str, dict[str, DeviceWindow]] = field(default_factory=dict)
    wave_figures: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    # --- building -------------------------------------------------------------------------------

    @classmethod
    def start(cls, spec: RolloutSpec, devices: Mapping[str, DeviceView], now: float) -> Rollout:
        """A new rollout over the devices of `spec.group` known now.

        Raises:
            ValueError: no device is in the group.
        """
        members = [d for d in devices.values() if spec.group in ("*", *d.groups)]
        if not members:
            raise ValueError(f"no device is in group {spec.group!r}")
        targets = target_order(spec.id, (d.device for d in members))
        rollout = cls(spec, targets, started_at=now, wave_started_at=now)
        cuts = [wave_size(w, len(targets)) for w in spec.waves]
        rollout._event(now, "rollout_started", devices=len(targets), wave_sizes=cuts)
        rollout._event(now, "wave_started", devices=targets[: cuts[0]])
        return rollout

    def to_json(self) -> dict[str, Any]:
        """The whole state (the driver stores it after every step)."""
        return {
            "spec": {**asdict(self.spec), "waves": list(self.spec.waves)},
            "targets": self.targets,
            "phase": self.phase,
            "wave": self.wave,
            "started_at": self.started_at,
            "wave_started_at": self.wave_started_at,
            "soak_started_at": self.soak_started_at,
            "paused_from": self.paused_from,
            "reason": self.reason,
            "aborted_at": self.aborted_at,
            "finished_at": self.finished_at,
            "jobs": {d: j.to_json() for d, j in self.jobs.items()},
            "windows": {
                d: {k: w.to_json() for k, w in ws.items()} for d, ws in self.windows.items()
            },
            "wave_figures": self.wave_figures,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Rollout:
        """The stored state back (pending events are not part of it: they were stored)."""
        spec = RolloutSpec(**{**doc["spec"], "waves": tuple(doc["spec"]["waves"])})
        rollout = cls(spec, list(doc["targets"]))
        for key in ("phase", "wave", "started_at", "wave_started_at", "soak_started_at"):
            setattr(rollout, key, doc[key])
        rollout.paused_from = doc["paused_from"]
        rollout.reason = doc["reason"]
        rollout.aborted_at = doc["aborted_at"]
        rollout.finished_at = doc["finished_at"]
        rollout.jobs = {d: Job(**j) for d, j in doc["jobs"].items()}
        rollout.windows = {
            d: {k: DeviceWindow.from_json(w) for k, w in ws.items()}
            for d, ws in doc["windows"].items()
        }
        rollout.wave_figures = list(doc["wave_figures"])
        return rollout

    # --- inputs ---------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the rollout ended (succeeded or aborted)."""
        return self.phase in DONE

    def take_events(self) -> list[dict[str, Any]]:
        """The decisions made since the last call, oldest first."""
        events, self.events = self.events, []
        return events

    def on_response(self, device: str, command_id: str, response: Mapping[str, Any]) -> None:
        """A device answered one of this rollout's commands (duplicates are harmless)."""
        job = self.jobs.get(device)
        if job is None:
            return
        rollback = ".rollback." in command_id
        step = job.rollback_step if rollback else job.step
        if command_id != self._id(device, "rollback" if rollback else "deploy", step):
            return  # an older step's answer, delivered again
        ok = bool(response.get("ok"))
        raw_error = response.get("error")
        error: Mapping[str, Any] = raw_error if isinstance(raw_error, dict) else {}
        detail = f"{error.get('code', '')}: {error.get('message', '')}" if not ok else ""
        last = step + 1 >= len(self._sequence(job.previous if rollback else None))
        if rollback:
            if job.rollback != "in_progress":
                return
            if not ok:
                job.rollback, job.detail = "failed", f"rollback: {detail}"
            elif last:
                job.rollback_confirmed = True
            else:
                job.rollback_step += 1
                job.rollback_sent_at = None  # the next command goes out at the next step
            return
        if job.state != "in_progress":
            return
        if not ok:
            job.state = "rejected" if error.get("code") in _REFUSED else "failed"
            job.detail = detail
        elif last:
            job.confirmed = True
        else:
            job.step += 1
            job.sent_at = None

    def on_telemetry(self, device: str, doc: Mapping[str, Any]) -> None:
        """A telemetry message: kept for the gate while soaking."""
        if self.phase != "soaking":
            return
        job = self.jobs.get(device)
        on_new = job is not None and job.state == "succeeded"
        if job is not None and not on_new:
            return  # touched but not serving the version: neither wave nor baseline
        for entry in doc.get("models") or []:
            if not isinstance(entry, dict) or entry.get("model") != self.spec.model:
                continue
            version = entry.get("version")
            if on_new != (version == self.spec.version):
                continue
            latency = entry.get("latency_us") or {}
            p95, p99 = latency.get("p95"), latency.get("p99")
            reading = (
                int(entry.get("requests") or 0),
                int(entry.get("failures") or 0),
                None if p95 is None else float(p95) / 1000,
                None if p99 is None else float(p99) / 1000,
            )
            key = "new" if on_new else "old"
            windows = self.windows.setdefault(device, {})
            if key in windows:
                windows[key].add(*reading)
            else:
                windows[key] = DeviceWindow(reading[0], reading[1], *reading)

    def pause(self, now: float) -> None:
        """Stop sending to new devices (in-flight jobs complete); idempotent."""
        if self.phase in ("running", "soaking"):
            self.paused_from, self.phase = self.phase, "paused"
            self._event(now, "paused")

    def resume(self, now: float) -> None:
        """Continue a paused rollout (a soak starts over); idempotent."""
        if self.phase == "paused":
            self.phase, self.paused_from = self.paused_from or "running", None
            if self.phase == "soaking":
                self.soak_started_at = now
                self.windows.clear()
            self._event(now, "resumed")

    def abort(self, now: float, reason: str, **figures: Any) -> None:
        """Roll back every touched device; idempotent."""
        if self.phase in ("rolling_back", *DONE):
            return
        self.phase, self.reason, self.aborted_at = "rolling_back", reason, now
        touched = [d for d, j in self.jobs.items() if j.touched]
        self._event(now, "aborted", reason=reason, rolling_back=touched, **figures)

    # --- the step -------------------------------------------------------------------------------

    def step(self, devices: Mapping[str, DeviceView], now: float) -> list[Send]:
        """Advance with the fleet as it is now; returns the commands to send."""
        self._confirm(devices, now)
        if self.phase == "running":
            return self._run_wave(devices, now)
        if self.phase == "soaking":
            self._soak(now)
            if self.phase == "running":
                return self._run_wave(devices, now)
        if self.phase == "rolling_back":
            return self._roll_back(devices, now)
        return []

    def resend(self) -> list[Send]:
        """The commands in flight (a restarted driver sends them again: same ids)."""
        sends = []
        for job in self.jobs.values():
            if job.state == "in_progress" and job.sent_at is not None and not job.confirmed:
                sends.append(self._send(job, "deploy", job.step))
            rollback_out = job.rollback == "in_progress" and job.rollback_sent_at is not None
            if rollback_out and not job.rollback_confirmed:
                sends.append(self._send(job, "rollback", job.rollback_step))
        return sends

    def _confirm(self, devices: Mapping[str, DeviceView], now: float) -> None:
        timeout = self.spec.job_timeout_s
        for job in self.jobs.values():
            view = devices.get(job.device)
            serving = view.versions(self.spec.model) if view is not None else ()
            if job.state == "in_progress":
                if job.confirmed and self.spec.version in serving:
                    job.state, job.detail = "succeeded", ""
                elif job.sent_at is not None and now - job.sent_at > timeout:
                    job.state, job.detail = "timed_out", f"no answer within {timeout:g} s"
            if job.rollback == "in_progress":
                if job.rollback_confirmed and job.previous in serving:
                    job.rollback = "succeeded"
                elif job.rollback_sent_at is not None and now - job.rollback_sent_at > timeout:
                    job.rollback = "timed_out"

    def _wave_devices(self) -> list[str]:
        return self.targets[: wave_size(self.spec.waves[self.wave], len(self.targets))]

    def _run_wave(self, devices: Mapping[str, DeviceView], now: float) -> list[Send]:
        sends: list[Send] = []
        for device in self._wave_devices():
            job = self.jobs.get(device)
            if job is None:
                job = self.jobs[device] = Job(device, self.wave)
            view = devices.get(device)
            if job.state == "queued" and view is not None and view.online:
                serving = view.versions(self.spec.model)
                if self.spec.version in serving:
                    job.state, job.detail = "succeeded", "already serving"
                    continue
                job.previous = max(serving) if serving else None
                job.state = "in_progress"
            if job.state == "in_progress" and job.sent_at is None and view and view.online:
                job.sent_at = now
                sends.append(self._send(job, "deploy", job.step))
        bad = [j.device for j in self.jobs.values() if j.state in BAD]
        if len(bad) > self.spec.max_failed:
            self.abort(
                now,
                f"{len(bad)} failed devices > {self.spec.max_failed} allowed",
                failed={d: f"{self.jobs[d].state}: {self.jobs[d].detail}" for d in bad},
            )
            return sends + self._roll_back(devices, now)
        wave = [self.jobs[d] for d in self._wave_devices()]
        waiting_offline = now - self.wave_started_at <= self.spec.job_timeout_s
        # An offline device holds its own wave for `job_timeout_s`, not the later ones.
        holding = [j for j in wave if j.state not in FINAL and (
            j.state != "queued" or (waiting_offline and j.wave == self.wave))]  # fmt: skip
        if not holding:
            figures = self._wave_done(wave, now)
            self.phase, self.soak_started_at = "soaking", now
            self.windows.clear()
            self._event(now, "wave_deployed", **figures)
            if self.spec.soak_s == 0:
                self._soak(now)
                if self.phase == "running":
                    return sends + self._run_wave(devices, now)
        return sends

    def _wave_done(self, wave: list[Job], now: float) -> dict[str, Any]:
        counts = {s: sum(1 for j in wave if j.state == s) for s in JOB_STATES}
        figures = {
            "wave_index": self.wave,
            "devices": len(wave),
            "deploy_s": round(now - self.wave_started_at, 3),
            "jobs": {s: n for s, n in counts.items() if n},
            "not_reached": [j.device for j in wave if j.state == "queued"],
        }
        self.wave_figures.append(figures)
        return figures

    def _soak(self, now: float) -> None:
        assert self.soak_started_at is not None
        if now - self.soak_started_at < self.spec.soak_s:
            return
        new = [w["new"] for w in self.windows.values() if "new" in w]
        old = [w["old"] for w in self.windows.values() if "old" in w]
        verdict = judge(
            self.spec.rules, window_of(new), window_of(old), min_requests=self.spec.min_requests
        )
        figures = {"wave_index": self.wave, "soak_s": round(now - self.soak_started_at, 3)}
        self.wave_figures[-1]["gate"] = dict(verdict.figures)
        if not verdict.passed:
            self._event(now, "gate_breached", breaches=list(verdict.breaches),
                        **figures, **verdict.figures)  # fmt: skip
            self.abort(now, "gate breached: " + "; ".join(verdict.breaches))
            return
        self._event(now, "gate_passed", **figures, **verdict.figures)
        if self.wave + 1 >= len(self.spec.waves):
            self.phase, self.finished_at = "succeeded", now
            jobs = self.jobs.values()
            self._event(
                now,
                "rollout_succeeded",
                duration_s=round(now - self.started_at, 3),
                succeeded=sum(1 for j in jobs if j.state == "succeeded"),
                not_reached=[j.device for j in jobs if j.state == "queued"],
            )
            return
        self.wave += 1
        self.phase, self.wave_started_at, self.soak_started_at = "running", now, None
        before = wave_size(self.spec.waves[self.wave - 1], len(self.targets))
        self._event(now, "wave_started", devices=self._wave_devices()[before:])

    def _roll_back(self, devices: Mapping[str, DeviceView], now: float) -> list[Send]:
        sends = []
        pending = False
        for job in self.jobs.values():
            if not job.touched or job.previous is None:
                continue
            view = devices.get(job.device)
            if job.rollback is None:
                job.rollback = "queued"
            if job.rollback == "queued" and view is not None and view.online:
                job.rollback = "in_progress"
            online = view is not None and view.online
            if job.rollback == "in_progress" and job.rollback_sent_at is None and online:
                job.rollback_sent_at = now
                sends.append(self._send(job, "rollback", job.rollback_step))
            if job.rollback in ("queued", "in_progress"):
                pending = True
        in_flight = any(j.rollback == "in_progress" for j in self.jobs.values())
        waited = now - (self.aborted_at or now) > self.spec.job_timeout_s
        if not pending or (not in_flight and waited):
            self.phase, self.finished_at = "aborted", now
            states = [j.rollback for j in self.jobs.values() if j.rollback is not None]
            self._event(
                now,
                "rolled_back",
                devices=len(states),
                succeeded=states.count("succeeded"),
                failed={j.device: j.detail for j in self.jobs.values() if j.rollback == "failed"},
                not_reached=[j.device for j in self.jobs.values() if j.rollback == "queued"],
                duration_s=round(now - self.started_at, 3),
            )
        return sends

    # --- commands -------------------------------------------------------------------------------

    def _id(self, device: str, purpose: str, step: int) -> str:
        return f"{self.spec.id}.{device}.{purpose}.{step}"

    def _sequence(self, rollback_to: int | None) -> list[tuple[str, dict[str, Any]]]:
        version = rollback_to if rollback_to is not None else self.spec.version
        model = self.spec.model
        if self.spec.via == "activate":
            return [("activate", {"model": model, "version": version})]
        return [("set-desired", {"models": {model: str(version)}}), ("sync", {})]

    def _send(self, job: Job, purpose: str, step: int) -> Send:
        sequence = self._sequence(job.previous if purpose == "rollback" else None)
        command, args = sequence[min(step, len(sequence) - 1)]
        return Send(job.device, self._id(job.device, purpose, step), command, args)

    def _event(self, now: float, kind: str, **figures: Any) -> None:
        self.events.append({"ts": now, "event": kind, "wave": self.wave, **figures})
