"""`edge-agent fleet inventory`, `fleet rollout ...` and `fleet exporter`.

    edge-agent fleet inventory [--group G] [--json]
    edge-agent fleet rollout start MODEL VERSION --group G --waves 5%,25%,100% \\
        --gate "p95_ms<=50,error_rate<=0.001" --soak 10m [--max-failed-devices N]
    edge-agent fleet rollout status [ID] [--json]
    edge-agent fleet rollout pause|resume|abort [ID]
    edge-agent fleet exporter --port 9400

`rollout start` and a `resume`/`abort` that finds no running driver drive the rollout in the
foreground and print its events; they exit 0 when it succeeded, 1 when it was aborted. Against
a running driver, `pause`, `resume` and `abort` queue a request it applies within a tick.
Rollouts live in `--db` (default `~/.local/state/edge-agent/rollouts.sqlite`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, TextIO

from agent.manager.devices import inventory_rows, inventory_table
from agent.manager.rollout import Rollout
from agent.manager.rollout_driver import FleetConnection, drive
from agent.manager.rollout_gate import GateError
from agent.manager.rollout_plan import JOB_STATES, Job, RolloutSpec
from agent.manager.rollout_store import RolloutConflictError, RolloutStore
from agent.wire.mqtt import MqttError, MqttSettings, random_client_id
from agent.wire.sqlite import StoreError

VERBS = ("inventory", "rollout", "exporter")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
DEFAULT_DB = Path.home() / ".local/state/edge-agent/rollouts.sqlite"


def duration(text: str) -> float:
    """Seconds from `10m`, `30s`, `500ms`, `1h` or a plain number of seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 10m, 30s, 500ms)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def waves(text: str) -> tuple[float, ...]:
    """Shares from `5%,25%,100%` (or `0.05,0.25,1`)."""
    shares = []
    for raw in text.split(","):
        part = raw.strip()
        try:
            shares.append(float(part[:-1]) / 100 if part.endswith("%") else float(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"wave {part!r} is not a share (e.g. 25%)") from None
    return tuple(shares)


def add_verbs(verbs: Any) -> list[argparse.ArgumentParser]:
    """Add the verbs; returns the parsers that talk to the broker (they get its options)."""
    inventory = verbs.add_parser("inventory", help="print the devices, groups and versions")
    inventory.add_argument("--group", help="only devices in this group")
    inventory.add_argument("--json", action="store_true", help="one JSON array")
    inventory.add_argument("--settle", type=duration, default=1.0, help="quiet time (1s)")
    rollout = verbs.add_parser("rollout", help="staged rollouts gated on telemetry")
    actions = rollout.add_subparsers(dest="rollout_command", required=True)
    start = actions.add_parser("start", help="start (or continue) a rollout")
    start.add_argument("model")
    start.add_argument("version", type=int)
    start.add_argument("--group", required=True, help='devices of this group ("*": all)')
    start.add_argument("--waves", type=waves, default=(0.05, 0.25, 1.0))
    start.add_argument("--gate", default="", help='e.g. "p95_ms<=50,error_rate<=0.001"')
    start.add_argument("--soak", type=duration, default=600.0, help="per wave (10m)")
    start.add_argument("--max-failed-devices", type=int, default=0)
    start.add_argument("--job-timeout", type=duration, default=300.0, help="per device (5m)")
    start.add_argument("--min-requests", type=int, default=0, help="traffic the gate needs")
    start.add_argument("--via", choices=("activate", "set-desired"), default="activate")
    start.add_argument("--id", dest="rollout_id", help="default: MODEL-vVERSION")
    start.add_argument("--settle", type=duration, default=1.0, help="inventory quiet time")
    status = actions.add_parser("status", help="where a rollout stands")
    status.add_argument("--json", action="store_true")
    status.add_argument("--events", type=int, default=10, help="last N events (10)")
    controls = [start, status]
    for name in ("pause", "resume", "abort"):
        controls.append(actions.add_parser(name, help=f"{name} a rollout"))
    for parser in controls:
        if parser is not start:
            parser.add_argument("rollout_id", nargs="?", help="default: the latest rollout")
        parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="the rollouts file")
        parser.add_argument("--tick", type=duration, default=0.2, help=argparse.SUPPRESS)
    exporter = verbs.add_parser("exporter", help="serve fleet telemetry to Prometheus")
    exporter.add_argument("--port", dest="http_port", type=int, default=9400, help="HTTP (9400)")
    exporter.add_argument("--bind", default="0.0.0.0")
    exporter.add_argument("--share", default="edge-exporters", help="shared subscription group")
    exporter.add_argument("--name", help="this exporter's name (default: random)")
    exporter.add_argument("--stale", type=duration, default=120.0, help="drop silent devices")
    return [inventory, *controls, exporter]


def run(args: argparse.Namespace, settings: MqttSettings, out: TextIO, err: TextIO) -> int:
    """Run one of `VERBS`; returns the exit code."""
    try:
        if args.fleet_command == "inventory":
            return asyncio.run(_inventory(settings, args, out))
        if args.fleet_command == "exporter":
            from agent.manager.exporter import serve  # noqa: PLC0415 - prometheus only here

            return asyncio.run(serve(settings, args, out))
        return _rollout(settings, args, out, err)
    except (ValueError, GateError, RolloutConflictError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else exc
        print(f"edge-agent: error: {message}", file=err)
        return 2
    except (MqttError, StoreError, TimeoutError) as exc:
        print(f"edge-agent: error: {str(exc) or 'the broker did not answer in time'}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130


async def _inventory(settings: MqttSettings, args: argparse.Namespace, out: TextIO) -> int:
    name = random_client_id("inventory")
    async with FleetConnection(settings, args.prefix, name=name, persistent=False) as conn:
        await conn.settle(args.settle)
    devices = conn.fleet.in_group(args.group)
    if args.json:
        print(json.dumps(inventory_rows(devices), indent=2, sort_keys=True), file=out)
    else:
        print(inventory_table(devices), file=out)
    return 0


def _rollout(settings: MqttSettings, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    store = RolloutStore(args.db)
    try:
        verb = args.rollout_command
        if verb == "start":
            return asyncio.run(_start(store, settings, args, out))
        rollout_id = args.rollout_id or store.latest()
        if rollout_id is None or store.load(rollout_id) is None:
            print(f"edge-agent: error: no rollout {args.rollout_id or ''} in {args.db}", file=err)
            return 2
        if verb == "status":
            _print_status(store, rollout_id, args, out)
            return 0
        now = time.time()
        store.request(rollout_id, verb, now)
        if store.driver(rollout_id, now) is not None:
            print(f"{verb} requested; the running driver applies it", file=out)
            return 0
        if verb == "pause":  # no driver: apply it to the stored state now
            rollout = store.load(rollout_id)
            assert rollout is not None
            store.take_requests(rollout_id)
            rollout.pause(now)
            store.save(rollout, now)
            print(f"rollout {rollout_id}: {rollout.phase}", file=out)
            return 0
        return asyncio.run(_drive(store, settings, args, rollout_id, out))
    finally:
        store.close()


async def _start(
    store: RolloutStore, settings: MqttSettings, args: argparse.Namespace, out: TextIO
) -> int:
    rollout_id = args.rollout_id or re.sub(r"[^A-Za-z0-9_-]", "_", f"{args.model}-v{args.version}")
    spec = RolloutSpec(
        id=rollout_id,
        model=args.model,
        version=args.version,
        group=args.group,
        waves=args.waves,
        gate=args.gate,
        soak_s=args.soak,
        max_failed=args.max_failed_devices,
        job_timeout_s=args.job_timeout,
        min_requests=args.min_requests,
        via=args.via,
    )
    async with FleetConnection(settings, args.prefix, name=f"rollout-{rollout_id}") as conn:
        await conn.settle(args.settle)
        now = time.time()
        rollout = store.create(Rollout.start(spec, conn.fleet.devices, now), now)
        print(f"rollout {rollout_id}: {len(rollout.targets)} devices", file=out, flush=True)
        return await _run_driver(conn, store, rollout_id, args, out)


async def _drive(
    store: RolloutStore,
    settings: MqttSettings,
    args: argparse.Namespace,
    rollout_id: str,
    out: TextIO,
) -> int:
    async with FleetConnection(settings, args.prefix, name=f"rollout-{rollout_id}") as conn:
        await conn.settle(1.0)
        return await _run_driver(conn, store, rollout_id, args, out)


async def _run_driver(
    conn: FleetConnection,
    store: RolloutStore,
    rollout_id: str,
    args: argparse.Namespace,
    out: TextIO,
) -> int:
    def show(event: dict[str, Any]) -> None:
        print(_event_line(event), file=out, flush=True)

    final = await drive(conn, store, rollout_id, tick_s=args.tick, on_event=show)
    print(
        f"rollout {rollout_id}: {final.phase} (messages sent {conn.sent}, "
        f"received {conn.received})",
        file=out,
    )
    return 0 if final.phase == "succeeded" else 1


def _event_line(event: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
    rest = {k: v for k, v in event.items() if k not in ("ts", "event", "wave")}
    return f"{stamp} wave {event['wave'] + 1} {event['event']} {json.dumps(rest, sort_keys=True)}"


def _job_doc(job: Job) -> dict[str, Any]:
    return {
        "wave": job.wave + 1,
        "state": job.state,
        "previous": job.previous,
        "rollback": job.rollback,
        "detail": job.detail,
    }


def status_doc(store: RolloutStore, rollout_id: str, events: int = 10) -> dict[str, Any]:
    """What `rollout status --json` prints."""
    rollout = store.load(rollout_id)
    assert rollout is not None
    jobs = rollout.jobs.values()
    return {
        "id": rollout_id,
        "model": rollout.spec.model,
        "version": rollout.spec.version,
        "group": rollout.spec.group,
        "phase": rollout.phase,
        "wave": rollout.wave + 1,
        "waves": len(rollout.spec.waves),
        "devices": len(rollout.targets),
        "reason": rollout.reason,
        "jobs": {s: sum(1 for j in jobs if j.state == s) for s in JOB_STATES},
        "rollback": {
            s: sum(1 for j in jobs if j.rollback == s)
            for s in JOB_STATES
            if any(j.rollback == s for j in jobs)
        },
        "devices_jobs": {j.device: _job_doc(j) for j in sorted(jobs, key=lambda j: j.device)},
        "wave_figures": rollout.wave_figures,
        "driver_pid": store.driver(rollout_id, time.time()),
        "events": [e for _n, e in store.events(rollout_id)][-events:] if events else [],
    }


def _print_status(
    store: RolloutStore, rollout_id: str, args: argparse.Namespace, out: TextIO
) -> None:
    doc = status_doc(store, rollout_id, args.events)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True), file=out)
        return
    jobs = " ".join(f"{s}={n}" for s, n in doc["jobs"].items() if n)
    print(
        f"rollout {rollout_id}: {doc['model']} v{doc['version']} to group {doc['group']} "
        f"({doc['devices']} devices)\nphase {doc['phase']}, wave {doc['wave']}/{doc['waves']}"
        f"{', ' + doc['reason'] if doc['reason'] else ''}\njobs: {jobs or '-'}",
        file=out,
    )
    if doc["rollback"]:
        print("rollback: " + " ".join(f"{s}={n}" for s, n in doc["rollback"].items()), file=out)
    driver = doc["driver_pid"]
    print(f"driver: {'pid ' + str(driver) if driver else 'not running'}", file=out)
    for event in doc["events"]:
        print("  " + _event_line(event), file=out)
