"""`make fleet-cluster`: past one broker. RabbitMQ's MQTT plugin as a 3-node cluster on this
machine, the simulated devices spread over its nodes, the manager and two exporters on it, and
the manager's own node stopped in the middle of a rollout.

    python -m bench.fleet_cluster [--devices 2000] [--nodes 3] [--telemetry 10] [--soak 15]
        [--stop-node 0] [--keep]

1. `bench.fleet_brokers.RabbitCluster`: `--nodes` nodes, one epmd, classic-config peer
   discovery, MQTT sessions in quorum queues (replicated: a session outlives its node).
2. The simulator: device `i` connects to node `i % nodes` and fails over to the others.
3. `fleet inventory` (MQTT 3.1.1: RabbitMQ 3.10 speaks no MQTT 5; statuses by rebirth).
4. Two exporters, on nodes 0 and 1, each failing over to the others.
5. `fleet rollout start m 2` on node `--stop-node` (failing over to the others), waves of
   10 %, 50 %, 100 %; once the second wave has started, that node is stopped (SIGTERM to its
   process group). The devices, the exporter and the manager that were on it move to the others.
6. Checks: the rollout succeeds with each device in one wave and sent the version once; every
   device reconnected and serves it; a fresh `fleet inventory` lists every device, online; the
   exporters together serve every device, none twice.

It prints the figures (node memory and CPU, the devices' time to come back, per wave) and the
checks, and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.manager.rollout_plan import wave_size
from bench.fleet10k import Report, names
from bench.fleet_brokers import RabbitCluster, accepts, free_port, rabbitmq_missing, wait_for
from bench.fleet_run import (
    Child,
    Sampler,
    Simulator,
    Usage,
    exporter_devices,
    fleet_cli,
    rollout_events,
    run,
    scrape,
    stop_all,
    table,
)

ROLLOUT = "cluster-v2"
WAVES = (0.10, 0.50, 1.0)
GATE = "p95_ms<=50,error_rate<=0.01"


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The run's size and pace."""

    devices: int = 2000
    nodes: int = 3
    telemetry_s: float = 10.0
    soak_s: float = 15.0
    stop_node: int = 0


def _cli(cluster: RabbitCluster, node: int, *argv: str, http: bool = False) -> list[str]:
    """A `fleet` command on `node`, failing over to the others, MQTT 3.1.1."""
    others = ",".join(f"{h}:{p}" for k, (h, p) in enumerate(cluster.brokers) if k != node)
    return [
        *fleet_cli(cluster.brokers[node], *argv, http=http),
        "--brokers",
        others,
        "--protocol",
        "3.1.1",
    ]


def run_cluster(opts: ClusterOptions, folder: Path) -> Report:
    """Run everything in `folder` (see module docstring); the figures and checks."""
    report = Report()
    c = report.checks
    n = opts.devices
    fleet = names(n)
    cluster = RabbitCluster(folder / "rabbit", nodes=opts.nodes)
    started = time.monotonic()
    cluster.start()
    report.figures["cluster_start_s"] = round(time.monotonic() - started, 1)
    db = folder / "rollouts.sqlite"
    children: list[Child | None] = []
    try:
        nodes = ",".join(f"{h}:{p}" for h, p in cluster.brokers)
        sim = Simulator(
            ["--brokers", nodes, "--protocol", "3.1.1", "--telemetry", f"{opts.telemetry_s:g}"],
            folder / "sim.log",
            n,
        )
        children.append(sim.child)
        report.figures["connect_s"] = round(sim.wait_connected(max(300.0, n / 10)), 1)
        report.figures["devices_per_node"] = sim.summary()["brokers"]
        _inventory(report, cluster, folder, fleet, "inventory-before", node=1)
        ports = [free_port(), free_port()]
        exporters = [
            Child(
                _cli(
                    cluster,
                    node,
                    "exporter",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--name",
                    f"exporter-{node}",
                    "--stale",
                    "120s",
                    http=True,
                ),
                folder / f"exporter-{node}.log",
            )
            for node, port in enumerate(ports)
        ]
        children.extend(exporters)
        for port in ports:
            wait_for(functools.partial(accepts, port), f"exporter on {port}", 60)
        sampler = Sampler(
            {
                "rabbitmq": cluster.pids(),
                "simulator": [sim.child.proc.pid],
                "exporters": [e.proc.pid for e in exporters],
            }
        )
        with sampler.running():
            before = {name: sampler.cpu_by_pid(name) for name in sampler.pids}
            rollout_started = time.monotonic()
            manager = Child(
                _cli(
                    cluster,
                    opts.stop_node,
                    "rollout",
                    "start",
                    "m",
                    "2",
                    "--id",
                    ROLLOUT,
                    "--group",
                    "fleet",
                    "--waves",
                    ",".join(f"{s * 100:g}%" for s in WAVES),
                    "--gate",
                    GATE,
                    "--soak",
                    f"{opts.soak_s:g}s",
                    "--job-timeout",
                    "600s",
                    "--db",
                    str(db),
                    "--settle",
                    "3s",
                ),
                folder / "rollout.log",
                stdout=folder / "rollout.out",
            )
            children.append(manager)
            back_s = _stop_mid_rollout(report, cluster, sim, manager, db, opts, n)
            code = manager.wait(1800 + 60 * len(WAVES) * opts.soak_s)
            took = time.monotonic() - rollout_started
            # The processes that ran from the rollout's start to its end (not the node stopped).
            report.figures["cpu_during_rollout_percent"] = {
                name: round(100 * _used(before[name], sampler.cpu_by_pid(name)) / max(took, 1e-9))
                for name in sampler.pids
            }
        report.figures["peak_rss_mb"] = {k: round(v) for k, v in sampler.peak_mb.items()}
        report.figures["devices_back_s"] = back_s
        assert manager.usage is not None
        report.figures["rollout"] = dataclasses.asdict(manager.usage)
        c.check("the rollout succeeds across the node stop", code == 0, manager.text()[-400:])
        _accounting(report, sim.summary(), db, fleet)
        _inventory(report, cluster, folder, fleet, "inventory-after", node=1)
        _exporters(report, ports, opts, fleet)
        stop_all(exporters)
        report.figures["simulator"] = dataclasses.asdict(sim.stop())
    finally:
        stop_all(children)
        cluster.stop()
    _tables(report, opts)
    return report


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before[pid] for pid, cpu in after.items() if pid in before)


def _stop_mid_rollout(
    report: Report,
    cluster: RabbitCluster,
    sim: Simulator,
    manager: Child,
    db: Path,
    opts: ClusterOptions,
    n: int,
) -> float | None:
    """Stop a node once the second wave started; seconds until every device is back."""

    def second_wave() -> bool:
        if manager.exited():
            raise RuntimeError(f"the rollout ended before its second wave: {manager.text()[-300:]}")
        if not db.exists():
            return False
        try:
            events = rollout_events(db, ROLLOUT)
        except sqlite3.Error:  # the driver is creating the file
            return False
        return sum(1 for e in events if e["event"] == "wave_started") >= 2

    wait_for(second_wave, "the second wave", 600)
    stopped_at = time.monotonic()
    cluster.stop_node(opts.stop_node)
    report.figures["node_stop_s"] = round(time.monotonic() - stopped_at, 1)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        summary = sim.summary()
        gone = f"127.0.0.1:{cluster.ports[opts.stop_node]}"
        if summary["connected"] == n and gone not in summary["brokers"]:
            report.figures["devices_per_node_after"] = summary["brokers"]
            return round(time.monotonic() - stopped_at, 1)
        time.sleep(0.5)
    return None


def _inventory(
    report: Report, cluster: RabbitCluster, folder: Path, fleet: list[str], name: str, node: int
) -> None:
    code, out, usage = run(
        _cli(cluster, node, "inventory", "--json", "--settle", "3s"), folder / f"{name}.log", 600
    )
    rows = json.loads(out) if code == 0 else []
    online = sorted(r["device"] for r in rows if r["state"] == "online")
    report.checks.check(
        f"{name}: every device once, online",
        online == fleet,
        f"{len(online)} of {len(fleet)} online",
    )
    report.figures[name] = dataclasses.asdict(usage)


def _accounting(report: Report, summary: dict[str, Any], db: Path, fleet: list[str]) -> None:
    c = report.checks
    events = rollout_events(db, ROLLOUT)
    deployed = [e for e in events if e["event"] == "wave_deployed"]
    cuts = [wave_size(s, len(fleet)) for s in WAVES]
    c.check(
        "each wave deployed once, to its size",
        [d["devices"] for d in deployed] == cuts,
        [d["devices"] for d in deployed],
    )
    waves = [set(e["devices"]) for e in events if e["event"] == "wave_started"]
    c.check(
        "each device in exactly one wave",
        sum(map(len, waves)) == len(fleet) and set().union(*waves) == set(fleet),
    )
    log = summary["log"]
    sent = {d: [e for e in log.get(d, []) if e[0].startswith(f"{ROLLOUT}.")] for d in fleet}
    c.check(
        "each device ran the rollout's activate exactly once",
        all(len(v) == 1 and v[0][1:4] == ["activate", 2, True] for v in sent.values()),
        {d: v for d, v in sent.items() if len(v) != 1},
    )
    c.check("every device serves v2", summary["serving"] == {"2": len(fleet)}, summary["serving"])
    c.check("every device is connected", summary["connected"] == len(fleet))
    report.figures["duplicates_answered"] = summary["duplicates"]
    report.figures["waves"] = [
        {"wave": d["wave_index"] + 1, "devices": d["devices"], "deploy_s": d["deploy_s"]}
        for d in deployed
    ]
    report.figures["rollout_s"] = next(
        (e["duration_s"] for e in events if e["event"] == "rollout_succeeded"), None
    )


def _exporters(report: Report, ports: list[int], opts: ClusterOptions, fleet: list[str]) -> None:
    deadline = time.monotonic() + 3 * opts.telemetry_s + 90
    while True:
        scraped = [scrape(f"http://127.0.0.1:{p}/metrics") for p in ports]
        served = [exporter_devices(text)[0] for text, _took, _size in scraped]
        if set().union(*served) == set(fleet) or time.monotonic() > deadline:
            break
        time.sleep(2)
    a, b = served
    c = report.checks
    c.check("the exporters together serve every device", a | b == set(fleet), len(a | b))
    c.check("no device is served by both exporters", not a & b, sorted(a & b)[:5])
    report.figures["exporters"] = [
        {"devices": len(s), "scrape_s": round(took, 3), "bytes": size}
        for s, (_t, took, size) in zip(served, scraped, strict=True)
    ]


def _tables(report: Report, opts: ClusterOptions) -> None:
    f = report.figures
    procs: list[list[object]] = [["process", "wall s", "CPU s", "CPU %", "peak RSS MiB"]]
    for key in ("inventory-before", "rollout", "inventory-after", "simulator"):
        if key in f:
            u = Usage(**f[key])
            procs.append(
                [key, round(u.wall_s, 1), round(u.cpu_s, 1), round(u.cpu_percent), round(u.rss_mb)]
            )
    report.tables.append(f"processes:\n{table(procs)}")
    waves: list[list[object]] = [["wave", "devices (cumulative)", "deploy s"]]
    waves += [[w["wave"], w["devices"], w["deploy_s"]] for w in f.get("waves", [])]
    report.tables.append(f"rollout m v2 on the cluster:\n{table(waves)}")
    during, peak = f.get("cpu_during_rollout_percent", {}), f.get("peak_rss_mb", {})
    other: list[list[object]] = [
        ["figure", "value"],
        ["nodes, devices", f"{opts.nodes}, {opts.devices}"],
        ["cluster started in s", f.get("cluster_start_s")],
        ["devices connected in s", f.get("connect_s")],
        ["devices per node", f.get("devices_per_node")],
        [f"node {opts.stop_node} stopped (SIGTERM) in s", f.get("node_stop_s")],
        ["every device back on the others in s", f.get("devices_back_s")],
        ["devices per node after", f.get("devices_per_node_after")],
        ["commands answered as duplicates", f.get("duplicates_answered")],
        ["rollout s (all waves, soaks)", f.get("rollout_s")],
        [
            "RabbitMQ nodes left: CPU % over the rollout, peak RSS MiB (all nodes)",
            f"{during.get('rabbitmq')}, {peak.get('rabbitmq')}",
        ],
        ["simulator, exporters: CPU %", f"{during.get('simulator')}, {during.get('exporters')}"],
    ]
    for i, e in enumerate(f.get("exporters", [])):
        other.append(
            [
                f"exporter {i}: devices, scrape s, bytes",
                f"{e['devices']}, {e['scrape_s']}, {e['bytes']:,}",
            ]
        )
    report.tables.append(table(other))


def main(argv: list[str] | None = None) -> int:
    """Run the cluster benchmark; 0 when every check held."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--telemetry", type=float, default=10.0, help="seconds (10)")
    parser.add_argument("--soak", type=float, default=15.0, help="seconds per wave (15)")
    parser.add_argument("--stop-node", type=int, default=0, help="the manager's node (0)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    args = parser.parse_args(argv)
    missing = rabbitmq_missing()
    if missing is not None:
        print(f"edge-agent bench: {missing}", file=sys.stderr)
        return 2
    opts = ClusterOptions(args.devices, args.nodes, args.telemetry, args.soak, args.stop_node)
    folder = Path(tempfile.mkdtemp(prefix="fleet-cluster-"))
    try:
        report = run_cluster(opts, folder)
    finally:
        if args.keep:
            print(f"logs in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for text in report.tables:
        print(f"\n{text}")
    print(f"\nchecks:\n{report.checks.table()}")
    if args.out:
        args.out.write_text(json.dumps(report.figures, indent=2, sort_keys=True) + "\n")
    return 1 if report.checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
