"""One simulated device: the device side of the fleet wire, without a model behind it.

`SimDevice` publishes the documents the real agent publishes, built by the same code
(`agent.fleet.documents`; commands parsed by `agent.fleet.commands.parse_command`; SLO alerts by
`agent.fleet.slo.SloEvaluator` in `bench.fleet_sim`): the retained status on connect and after
every change, telemetry, events (`version_activated`, `swap_failed`, `slo_breach`...) and command
responses on the reply topic. Its MQTT connection is the agent's own adapter
(`agent.wire.mqtt.MqttClient`); `bench.fleet_sim` runs thousands of them in one process.

What a device does is the agent's semantics with the model work left out: `activate` swaps to a
cached version (or fails with `load_failed` on the devices `Profile.broken` names, the old
version serving on and the version rejected), `rollback` goes back to the previous version (or
the one named) and rejects the one left, `set-desired` stores the desired state and `sync`
activates it; each command id runs at most once (a duplicate gets the stored response with
`"duplicate": true`). Telemetry reports request counters and latency per `Profile`; a device in
`Profile.regress` reports a worse p95 and error rate while it serves `regress_version`.

Every executed command is logged (`SimDevice.log`), so a test or the benchmark can check who was
touched, and how many times.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent import __version__
from agent.errors import AgentError, ModelLoadError, ModelNotFoundError, UnsupportedError
from agent.fleet import commands as cmd
from agent.fleet import documents as wire
from agent.fleet.inventory import served_versions
from agent.fleet.rebirth import RebirthPacer
from agent.fleet.slo import Sample, SloEvaluator
from agent.wire.mqtt import Message, MqttClient, MqttError
from agent.wire.topics import Topics

logger = logging.getLogger(__name__)

MAX_IDS = 1000  # command ids remembered per device, as the agent's `FleetState`
_MAX_COMMAND_BYTES = 64 * 1024  # the agent's default `max_command_bytes`


def share_of(names: Sequence[str], share: float, salt: str) -> frozenset[str]:
    """A fixed pseudo-random `share` of `names` (by a hash of salt and name)."""
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{salt}/{n}".encode()).digest())
    return frozenset(ranked[: round(share * len(ranked))])


@dataclass(frozen=True, slots=True)
class Profile:
    """What the simulated devices serve, and how they behave."""

    model: str = "m"
    cached: tuple[int, ...] = (1, 2, 3)  # versions every device's cache holds
    serving: int = 1  # the version active at start
    broken: frozenset[str] = frozenset()  # devices where `broken_version` fails to load
    broken_version: int | None = None
    regress: frozenset[str] = frozenset()  # devices whose figures regress on `regress_version`
    regress_version: int | None = None
    requests_per_s: float = 20.0  # per device
    p95_ms: float = 12.0
    regressed_p95_ms: float = 250.0
    error_rate: float = 0.0
    regressed_error_rate: float = 0.05
    slo: tuple[str, ...] = ("*:p95_ms=50,error_rate=0.01",)

    def fails(self, device: str, version: int) -> bool:
        """Whether `version` fails to load on `device`."""
        return version == self.broken_version and device in self.broken

    def regressed(self, device: str, version: int | None) -> bool:
        """Whether `device` reports regressed figures while serving `version`."""
        return version is not None and version == self.regress_version and device in self.regress


@dataclass(frozen=True, slots=True)
class Executed:
    """One command a device ran (duplicates are not logged)."""

    id: str
    command: str
    version: int | None
    ok: bool
    at: float  # Unix seconds


@dataclass(slots=True)
class _Counters:
    requests: float = 0.0
    failures: float = 0.0


@dataclass(slots=True)
class SimDevice:
    """One simulated device (see module docstring); `start` it on the simulator's loop."""

    name: str
    groups: tuple[str, ...]
    profile: Profile
    topics: Topics
    started: float
    serving: int | None = None
    history: list[int] = field(default_factory=list)  # versions served before, oldest first
    rejected: dict[int, dict[str, Any]] = field(default_factory=dict)
    desired: dict[str, str] = field(default_factory=dict)
    seen: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    log: list[Executed] = field(default_factory=list)
    duplicates: int = 0
    counters: dict[int, _Counters] = field(default_factory=dict)
    seq: int = 0
    client: MqttClient | None = None
    slo: SloEvaluator | None = None
    jitter: random.Random = field(default_factory=random.Random)
    rebirth: RebirthPacer = field(default_factory=RebirthPacer)

    # --- documents --------------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """The status document, as the agent's `FleetLink.status()` builds it."""
        served = {self.profile.model: [self.serving]} if self.serving is not None else {}
        return wire.status_document(
            self.name,
            now,
            faults={},
            agent_version=__version__,
            mqtt=self.client.protocol if self.client else None,
            groups=self.groups,
            models=[{"name": m, "versions": v} for m, v in served.items()],
            served=served_versions(served, {}, []),
            inventory=_FACTS,
            rejected=self.rejected_list(),
            desired=dict(self.desired),
            outbox={
                "queued": 0,
                "dropped_telemetry": 0,
                "dropped_events": 0,
                "last_seq": self.seq,
            },
        )

    def rejected_list(self) -> list[dict[str, Any]]:
        """The rejected versions, as the status and telemetry list them."""
        return [
            {"model": self.profile.model, "version": v, **why}
            for v, why in sorted(self.rejected.items())
        ]

    def telemetry(self, now: float, interval_s: float) -> tuple[dict[str, Any], list[Sample]]:
        """A telemetry document (its counters advanced by one interval) and its SLO samples."""
        p = self.profile
        doc = wire.envelope("telemetry", self.name, now)
        models: list[dict[str, Any]] = []
        samples: list[Sample] = []
        if self.serving is not None:
            version = self.serving
            bad = p.regressed(self.name, version)
            count = self.counters.setdefault(version, _Counters())
            rate = p.requests_per_s * (0.9 + 0.2 * self.jitter.random())
            count.requests += rate * interval_s
            count.failures += rate * interval_s * (p.regressed_error_rate if bad else p.error_rate)
            p95 = (p.regressed_p95_ms if bad else p.p95_ms) * (0.95 + 0.1 * self.jitter.random())
            latency = {"p50": p95 * 400, "p90": p95 * 850, "p95": p95 * 1000, "p99": p95 * 1300}
            latency = {k: round(v, 1) for k, v in latency.items()}
            requests, failures = int(count.requests), int(count.failures)
            models.append(
                wire.model_telemetry(
                    p.model,
                    version,
                    requests=requests,
                    failures=failures,
                    inferences_per_s=round(rate, 2),
                    latency_us=latency,
                    queue_us={
                        "mean": 150.0,
                        "p50": 120.0,
                        "p90": 300.0,
                        "p95": 400.0,
                        "p99": 600.0,
                    },
                    mean_batch_size=1.0,
                    cache_hit_rate=None,
                    pending=0,
                )
            )
            samples.append(
                Sample(
                    p.model,
                    version,
                    requests - failures,
                    failures,
                    latency["p95"],
                    latency["p99"],
                    requests,
                    requests * 150_000,
                )
            )
        self.seq += 1
        doc.update(
            seq=self.seq,
            uptime_s=round(now - self.started, 1),
            models=models,
            memory={"budget_bytes": 8 << 30, "used_bytes": 120 << 20},
            cache_disk_bytes=len(p.cached) * (40 << 20),
            sync=None,
            rejected=self.rejected_list(),
            outbox={
                "queued": 0,
                "dropped_telemetry": 0,
                "dropped_events": 0,
                "last_seq": self.seq,
            },
        )
        return doc, samples

    # --- commands ---------------------------------------------------------------------------

    def answer(self, payload: bytes, now: float) -> dict[str, Any]:
        """The response to one command payload (executing it once per id)."""
        try:
            command = cmd.parse_command(payload, max_bytes=_MAX_COMMAND_BYTES)
        except (cmd.CommandError, cmd.CommandTooLargeError) as exc:
            return wire.response_doc(self._envelope(now), exc.command_id, None, error=exc)
        stored = self.seen.get(command.id)
        if stored is not None:
            self.duplicates += 1
            return {**stored, "duplicate": True, "ts": now}
        try:
            result = self.execute(command.body, now)
            response = wire.response_doc(
                self._envelope(now), command.id, command.name, result=result
            )
        except AgentError as exc:
            response = wire.response_doc(self._envelope(now), command.id, command.name, error=exc)
        if not isinstance(command.body, cmd.READ_ONLY):
            version = getattr(command.body, "version", None)
            self.log.append(Executed(command.id, command.name, version, bool(response["ok"]), now))
        self.seen[command.id] = response
        while len(self.seen) > MAX_IDS:
            self.seen.popitem(last=False)
        return response

    def execute(self, body: cmd.CommandBody, now: float) -> dict[str, Any]:
        """Do what one command asks (the agent's semantics, no model work).

        Raises:
            AgentError: as the agent's data plane raises it (`load_failed`, `not_found`, ...).
        """
        match body:
            case cmd.Status():
                return self.status(now)
            case cmd.Ping():
                return {"pong": True}
            case cmd.Rebirth():
                self.publish_status(now)
                return self.status(now)
            case cmd.Activate(model=model, version=version):
                self.rejected.pop(version, None)  # the agent lifts the rejection first
                return {"model": model, "strategy": self._activate(model, version, now)}
            case cmd.Rollback(model=model, version=version):
                return {"model": model, "version": self._rollback(model, version, now)}
            case cmd.SetDesired(models=models):
                self.desired = dict(models)
                cleared: dict[str, list[int]] = {}
                for m, _policy in models:
                    if m in ("*", self.profile.model) and self.rejected:
                        cleared[self.profile.model] = sorted(self.rejected)
                        self.rejected.clear()
                self.publish_status(now)
                return {"desired": dict(models), "cleared": cleared}
            case cmd.Sync():
                return self._sync(now)
            case cmd.ClearRejected(model=model, version=version):
                self._check_model(model)
                gone = sorted(self.rejected) if version is None else [version]
                lifted = [v for v in gone if self.rejected.pop(v, None) is not None]
                return {"model": model, "cleared": lifted}
        raise UnsupportedError(f"'{type(body).__name__}' is not simulated")

    def _check_model(self, model: str) -> None:
        if model != self.profile.model:
            raise ModelNotFoundError(f"model '{model}' is not in the cache")

    def _activate(self, model: str, version: int, now: float) -> str:
        self._check_model(model)
        if version not in self.profile.cached:
            raise ModelNotFoundError(f"version {version} of '{model}' is not in the cache")
        if version == self.serving:
            return "already active"
        if self.profile.fails(self.name, version):
            reason = f"version {version} of '{model}' failed to load (simulated)"
            self.rejected[version] = {"cause": "failed", "reason": reason, "rejected_at": now}
            detail = {"reason": reason, "strategy": "load-then-switch", "serving": [self.serving]}
            self.event(model, version, "swap_failed", detail, now)
            self.publish_status(now)
            raise ModelLoadError(reason)
        self._switch(version, now)
        return "load-then-switch"

    def _rollback(self, model: str, version: int | None, now: float) -> int:
        self._check_model(model)
        target = version if version is not None else (self.history[-1] if self.history else None)
        if target is None or target not in self.profile.cached:
            raise ModelNotFoundError(f"'{model}' has no version to roll back to")
        left = self.serving
        self._switch(target, now)
        if left is not None and left != target:
            self.rejected[left] = {
                "cause": "rolled-back",
                "reason": "rolled back",
                "rejected_at": now,
            }
        return target

    def _sync(self, now: float) -> dict[str, Any]:
        policy = self.desired.get(self.profile.model) or self.desired.get("*")
        activated: list[list[Any]] = []
        rejected: list[list[Any]] = []
        if policy and policy != "latest":
            version = max(int(v) for v in policy.split(","))
            if version != self.serving and version not in self.rejected:
                try:
                    self._activate(self.profile.model, version, now)
                    activated.append([self.profile.model, version])
                except ModelLoadError:
                    rejected.append([self.profile.model, version])
        return {"installed": [], "activated": activated, "rejected": rejected, "errors": []}

    def _switch(self, version: int, now: float) -> None:
        if self.serving is not None:
            self.history = [v for v in self.history if v != self.serving] + [self.serving]
        self.serving = version
        self.history = [v for v in self.history if v != version]
        detail = {"versions": [version], "strategy": "load-then-switch"}
        self.event(self.profile.model, version, "version_activated", detail, now)
        self.publish_status(now)

    # --- publishing -------------------------------------------------------------------------

    def _envelope(self, now: float) -> dict[str, Any]:
        return wire.envelope("response", self.name, now)

    def publish_status(self, now: float) -> None:
        """The retained status, now (when connected)."""
        if self.client is not None and self.client.connected:
            self._send(self.topics.status, wire.encode(self.status(now)), retain=True)

    def event(
        self, model: str, version: int | None, kind: str, detail: dict[str, Any], now: float
    ) -> None:
        """An event on the events topic, with its `seq`."""
        self.seq += 1
        doc = {
            **wire.envelope("event", self.name, now),
            "seq": self.seq,
            **wire.event_body(model, version, kind, detail),
        }
        self._send(self.topics.events, wire.encode(doc))

    def _send(
        self, topic: str, payload: bytes, *, retain: bool = False, correlation: bytes | None = None
    ) -> None:
        if self.client is None:
            return
        try:
            done = self.client.publish(topic, payload, retain=retain, correlation_data=correlation)
        except MqttError as exc:
            logger.warning("%s: %s not published: %s", self.name, topic, exc)
            return
        done.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _rebirth_due(self) -> None:
        now = time.time()
        self.rebirth.fired(now)
        self.publish_status(now)

    def send_telemetry(self, doc: dict[str, Any]) -> None:
        """A telemetry document on the telemetry topic (QoS 1, as the agent's outbox sends it)."""
        self._send(self.topics.telemetry, wire.encode(doc))

    def on_message(self, message: Message) -> None:
        """A command (or a fleet-wide rebirth request)."""
        now = time.time()
        if message.topic == self.topics.rebirth_all and not message.retain:
            wait = self.rebirth.request(now)  # as the agent: paced, never dropped
            if wait == 0.0:
                self.publish_status(now)
            elif wait is not None:
                asyncio.get_running_loop().call_later(wait, self._rebirth_due)
            return
        if message.topic != self.topics.commands or message.retain:
            return
        response = self.answer(message.payload, now)
        reply = self.topics.reply_topic(message.response_topic)
        self._send(reply, wire.encode(response), correlation=message.correlation_data)


_FACTS = {
    "agent_version": __version__,
    "python": "3.11.2",
    "os": "Linux 5.15.136-tegra",
    "machine": "aarch64",
    "cpu_count": 8,
    "cpu_model": "ARMv8 Processor rev 1 (v8l)",
    "memory_bytes": 16 << 30,
    "board": "NVIDIA Jetson Orin NX (simulated)",
    "l4t": "36.3.0",
    "packages": {"onnxruntime-gpu": "1.18.0", "numpy": "1.26.4"},
}
