"""`make fleet-10k`: 10,000 simulated devices on a real Mosquitto, driven by the fleet manager's
own commands, with every device accounted for and the figures of each part.

    python -m bench.fleet10k [--devices 10000] [--telemetry 10s] [--soak 20s] [--out FILE]
        [--keep] [--no-browser]

What runs, each its own process, each ended by its pid:

1. Mosquitto with a fleet's limits (`bench.fleet_brokers.Mosquitto`).
2. The simulator (`bench.fleet_sim`): N devices, one MQTT connection each, telemetry every
   `--telemetry`; every 20th device in the order of the second rollout reports a p95 of
   250 ms on version 3: 5 % of each of its waves regress.
3. `fleet inventory --json`: every device once, online.
4. Two `fleet exporter`s sharing the fleet (MQTT 5 shared subscription) and `fleet dashboard`.
5. `fleet rollout start m 2` in waves of 1 %, 10 %, 50 %, 100 % with the gate
   `p95_ms<=50,error_rate<=0.01`: it must succeed with each device in exactly one wave, sent
   the version once, and serving it.
6. Both exporters scraped: together every device, none twice.
7. The dashboard: its state document, and its first paint in headless Chromium, paged (50
   rows) against the whole table the page drew before (the baseline, the same run).
8. `fleet rollout start m 3` in waves of 10 %, 50 %, 100 %: the regressing devices break the
   gate in wave 1; exactly the devices of wave 1 are rolled back, nobody else is sent anything.
9. The bottleneck this run found, before and after, on the stored 10,000-job state: storing
   the rollout at every 0.2 s tick with `dataclasses.asdict`, against the driver's policy now.

It prints the figures, then the checks, and exits 1 if a check failed. `--out` writes the
figures as JSON. `tests/bench/test_fleet10k.py` runs the same with a few hundred devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.manager.dashboard_page import render_dashboard
from agent.manager.rollout import Rollout
from agent.manager.rollout_plan import target_order, wave_size
from bench.fleet_brokers import Mosquitto, accepts, free_port, wait_for
from bench.fleet_browser import browser_missing, first_paint
from bench.fleet_run import (
    BrokerCounters,
    Checks,
    Child,
    Sampler,
    Simulator,
    Usage,
    exporter_devices,
    fleet_cli,
    get_json,
    rates,
    rollout_events,
    rollout_state,
    run,
    scrape,
    stop_all,
    table,
)

OK_ID, BAD_ID = "fleet-v2", "fleet-v3"
WAVES_OK = (0.01, 0.10, 0.50, 1.0)
WAVES_BAD = (0.10, 0.50, 1.0)
GATE = "p95_ms<=50,error_rate<=0.01"
REGRESS_EVERY = 20  # 5 % of each wave of the second rollout
TICK_S = 0.2  # the driver's tick (`fleet rollout --tick`)


@dataclass(frozen=True, slots=True)
class Options:
    """The run's size and pace."""

    devices: int = 10_000
    telemetry_s: float = 10.0
    soak_s: float = 20.0
    browser: bool = True


@dataclass(slots=True)
class Report:
    """What the run found."""

    figures: dict[str, Any] = field(default_factory=dict)
    checks: Checks = field(default_factory=Checks)
    tables: list[str] = field(default_factory=list)


def names(devices: int) -> list[str]:
    """The simulator's device ids."""
    return [f"sim{i:05d}" for i in range(devices)]


def _waves(shares: tuple[float, ...]) -> str:
    return ",".join(f"{s * 100:g}%" for s in shares)


def _usage(u: Usage) -> list[object]:
    return [round(u.wall_s, 1), round(u.cpu_s, 1), round(u.cpu_percent), round(u.rss_mb)]


def _rollout(
    addr: tuple[str, int],
    folder: Path,
    db: Path,
    rollout: str,
    version: int,
    waves: tuple[float, ...],
    opts: Options,
) -> Child:
    argv = fleet_cli(
        addr,
        "rollout",
        "start",
        "m",
        str(version),
        "--id",
        rollout,
        "--group",
        "fleet",
        "--waves",
        _waves(waves),
        "--gate",
        GATE,
        "--soak",
        f"{opts.soak_s:g}s",
        "--job-timeout",
        "600s",
        "--db",
        str(db),
        "--settle",
        "2s",
    )
    return Child(argv, folder / f"{rollout}.log", stdout=folder / f"{rollout}.out")


def run_scenario(opts: Options, folder: Path) -> Report:
    """Run everything in `folder` (see module docstring); the figures and checks."""
    report = Report()
    n = opts.devices
    fleet = names(n)
    bad_order = target_order(BAD_ID, fleet)
    regress = bad_order[::REGRESS_EVERY]
    (folder / "regress.txt").write_text("\n".join(regress) + "\n")
    broker = Mosquitto(folder / "broker", devices=n)
    broker.start()
    addr = broker.brokers[0]
    db = folder / "rollouts.sqlite"
    children: list[Child | None] = []
    try:
        sim = Simulator(
            [
                "--port",
                str(broker.port),
                "--telemetry",
                f"{opts.telemetry_s:g}s",
                "--regress-devices",
                str(folder / "regress.txt"),
                "--regress-version",
                "3",
            ],
            folder / "sim.log",
            n,
        )
        children.append(sim.child)
        connect_s = sim.wait_connected(max(180.0, n / 20))
        report.figures["connect_s"] = round(connect_s, 1)
        _inventory(report, addr, folder, fleet)
        ports = [free_port(), free_port()]
        exporters = [
            Child(
                fleet_cli(
                    addr,
                    "exporter",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--name",
                    f"exporter-{c}",
                    "--share",
                    "bench",
                    "--stale",
                    "120s",
                    http=True,
                ),
                folder / f"exporter-{c}.log",
            )
            for c, port in zip("ab", ports, strict=True)
        ]
        children.extend(exporters)
        dash_port = free_port()
        dashboard = Child(
            fleet_cli(
                addr, "dashboard", "--port", str(dash_port), "--rollouts", str(db), http=True
            ),
            folder / "dashboard.log",
        )
        children.append(dashboard)
        for port in (*ports, dash_port):
            wait_for(functools.partial(accepts, port), f"the manager's HTTP port {port}", 60)
        pids = {
            "broker": broker.pids(),
            "simulator": [sim.child.proc.pid],
            "exporters": [e.proc.pid for e in exporters],
            "dashboard": [dashboard.proc.pid],
        }
        sampler = Sampler(pids)
        with BrokerCounters(broker.settings()) as counters, sampler.running():
            _good_rollout(report, sim, sampler, counters, addr, folder, db, opts, fleet)
            _exporters(report, ports, opts, fleet)
            _dashboard(report, dash_port, folder, opts, n)
            _bad_rollout(report, sim, addr, folder, db, opts, fleet, bad_order, set(regress))
        report.figures["peak_rss_mb"] = {k: round(v) for k, v in sampler.peak_mb.items()}
        _store_before_after(report, db)
        stop_all([*exporters, dashboard])
        report.figures["simulator"] = dataclasses.asdict(sim.stop())
    finally:
        stop_all(children)
        broker.stop()
    _tables(report, opts)
    return report


def _inventory(report: Report, addr: tuple[str, int], folder: Path, fleet: list[str]) -> None:
    code, out, usage = run(
        fleet_cli(addr, "inventory", "--json", "--settle", "2s"), folder / "inventory.log", 600
    )
    rows = json.loads(out) if code == 0 else []
    c = report.checks
    c.check("inventory exits 0", code == 0, (folder / "inventory.log").read_text()[-300:])
    seen = [r["device"] for r in rows]
    c.check("inventory lists every device once", sorted(seen) == fleet, f"{len(seen)} rows")
    c.check("inventory: every device online", all(r["state"] == "online" for r in rows))
    c.check(
        "inventory: groups and versions",
        all(r["models"] == {"m": [1]} and r["groups"][0] == "fleet" for r in rows),
    )
    report.figures["inventory"] = dataclasses.asdict(usage)


def _good_rollout(
    report: Report,
    sim: Simulator,
    sampler: Sampler,
    counters: BrokerCounters,
    addr: tuple[str, int],
    folder: Path,
    db: Path,
    opts: Options,
    fleet: list[str],
) -> None:
    before = {name: sampler.cpu_s(name) for name in sampler.pids}
    mark = counters.mark()
    manager = _rollout(addr, folder, db, OK_ID, 2, WAVES_OK, opts)
    code = manager.wait(1800 + 60 * len(WAVES_OK) * opts.soak_s)
    took = manager.usage.wall_s if manager.usage else 0.0
    report.figures["broker_messages_per_s"] = rates(mark, counters.mark())
    report.figures["cpu_during_rollout_percent"] = {
        name: round(100 * (sampler.cpu_s(name) - before[name]) / max(took, 1e-9))
        for name in sampler.pids
    }
    assert manager.usage is not None
    report.figures["rollout_ok"] = dataclasses.asdict(manager.usage)
    summary = sim.summary()
    c = report.checks
    c.check("rollout v2 succeeds", code == 0, manager.text()[-300:])
    events = rollout_events(db, OK_ID)
    starts = [e for e in events if e["event"] == "wave_started"]
    deployed = [e for e in events if e["event"] == "wave_deployed"]
    cuts = [wave_size(s, len(fleet)) for s in WAVES_OK]
    c.check(
        "each wave deployed once, to its size",
        [d["devices"] for d in deployed] == cuts,
        [d["devices"] for d in deployed],
    )
    c.check(
        "every job of each wave succeeded, none unreached",
        all(d["jobs"] == {"succeeded": d["devices"]} and not d["not_reached"] for d in deployed),
    )
    waves = [set(s["devices"]) for s in starts]
    c.check(
        "each device in exactly one wave",
        sum(map(len, waves)) == len(fleet) and set().union(*waves) == set(fleet),
    )
    log = summary["log"]
    sent = {d: [e for e in log.get(d, []) if e[0].startswith(f"{OK_ID}.")] for d in fleet}
    c.check(
        "each device ran the rollout's activate of v2 exactly once",
        all(len(v) == 1 and v[0][1:4] == ["activate", 2, True] for v in sent.values()),
    )
    state = rollout_state(db, OK_ID)
    c.check(
        "each job is in its own wave",
        all(state["jobs"][d]["wave"] == i for i, w in enumerate(waves) for d in w),
    )
    c.check("every device serves v2", summary["serving"] == {"2": len(fleet)}, summary["serving"])
    c.check("no command answered as a duplicate", summary["duplicates"] == 0)
    gates = [e for e in events if e["event"] == "gate_passed"]
    rows: list[list[object]] = [
        ["wave", "new devices", "deploy s", "commands/s", "device exec span s", "wave + soak s"]
    ]
    figures = []
    for i, (start, done) in enumerate(zip(starts, deployed, strict=True)):
        new = len(start["devices"])
        execs = sorted(sent[d][0][4] - start["ts"] for d in start["devices"] if sent[d])
        span = round(execs[-1] - execs[0], 2) if execs else None
        whole = round(gates[i]["ts"] - start["ts"], 1) if i < len(gates) else None
        per_s = round(new / done["deploy_s"]) if done["deploy_s"] else None
        figures.append(
            {
                "wave": i + 1,
                "devices": new,
                "deploy_s": done["deploy_s"],
                "commands_per_s": per_s,
                "exec_span_s": span,
                "wave_s": whole,
            }
        )
        rows.append([i + 1, new, done["deploy_s"], per_s, span, whole])
    report.figures["waves"] = figures
    report.figures["rollout_ok_s"] = next(
        (e["duration_s"] for e in events if e["event"] == "rollout_succeeded"), None
    )
    report.tables.append(f"rollout m v2, {len(fleet):,} devices:\n{table(rows)}")


def _exporters(report: Report, ports: list[int], opts: Options, fleet: list[str]) -> None:
    deadline = time.monotonic() + 3 * opts.telemetry_s + 60
    scraped: list[tuple[str, float, int]] = []
    while True:
        scraped = [scrape(f"http://127.0.0.1:{p}/metrics") for p in ports]
        served = [exporter_devices(text) for text, _took, _size in scraped]
        if set().union(*(s for s, _n in served)) == set(fleet) or time.monotonic() > deadline:
            break
        time.sleep(2)
    (a, a_says), (b, b_says) = served
    c = report.checks
    c.check("the exporters together serve every device", a | b == set(fleet), len(a | b))
    c.check("no device is served by both exporters", not a & b, sorted(a & b)[:5])
    c.check("each exporter's own count matches its page", (a_says, b_says) == (len(a), len(b)))
    report.figures["exporters"] = [
        {"devices": len(s), "scrape_s": round(took, 3), "bytes": size}
        for (s, _n), (_t, took, size) in zip(served, scraped, strict=True)
    ]


def _dashboard(report: Report, port: int, folder: Path, opts: Options, n: int) -> None:
    base = f"http://127.0.0.1:{port}"
    state, took, size = get_json(f"{base}/fleet/v1/state")
    c = report.checks
    c.check(
        "dashboard: every device counted, all online",
        state["devices_total"] == n and state["counts"]["online"] == n,
        state.get("counts"),
    )
    c.check("dashboard: one page of 50 rows", len(state["devices"]) == min(50, n))
    wave = state["rollouts"][0]["waves"][-1] if state["rollouts"] else {}
    last = n - wave_size(WAVES_OK[-2], n)
    c.check(
        "dashboard: the last wave's counts",
        (wave.get("size"), wave.get("counts")) == (last, {"succeeded": last}),
        wave.get("counts"),
    )
    try:
        refused = str(get_json(f"{base}/fleet/v1/state?per_page=100000")[0])
    except urllib.error.HTTPError as exc:
        refused = f"{exc.code} {exc.read().decode()}"
    c.check("dashboard: a page over 500 rows is refused", refused.startswith("400 "), refused)
    figures: dict[str, Any] = {"state_s": round(took, 3), "state_bytes": size}
    missing = browser_missing() if opts.browser else "--no-browser"
    if missing is None:
        rows: list[dict[str, Any]] = []
        for page in range(1, -(-n // 500) + 1):
            rows += get_json(f"{base}/fleet/v1/state?per_page=500&page={page}")[0]["devices"]
        whole = {**state, "devices": rows, "page": 1, "pages": 1, "devices_matching": n}
        baseline = folder / "whole-table.html"
        baseline.write_text(render_dashboard(whole))
        (paged_ms, paged_done, paged_rows), (whole_ms, whole_done, whole_rows) = first_paint(
            [f"{base}/", baseline.as_uri()]
        )
        c.check(
            "the paged page draws 50 rows, the baseline all",
            (paged_rows, whole_rows) == (min(50, n), n),
        )
        figures.update(
            first_paint_ms=paged_ms,
            baseline_first_paint_ms=whole_ms,
            dom_complete_ms=paged_done,
            baseline_dom_complete_ms=whole_done,
            page_bytes=len(scrape(f"{base}/")[0]),
            baseline_page_bytes=baseline.stat().st_size,
        )
    else:
        print(f"dashboard first paint not measured: {missing}", flush=True)
    report.figures["dashboard"] = figures


def _bad_rollout(
    report: Report,
    sim: Simulator,
    addr: tuple[str, int],
    folder: Path,
    db: Path,
    opts: Options,
    fleet: list[str],
    order: list[str],
    regress: set[str],
) -> None:
    manager = _rollout(addr, folder, db, BAD_ID, 3, WAVES_BAD, opts)
    code = manager.wait(1800 + 60 * opts.soak_s)
    assert manager.usage is not None
    report.figures["rollout_bad"] = dataclasses.asdict(manager.usage)
    summary = sim.summary()
    events = rollout_events(db, BAD_ID)
    c = report.checks
    c.check("rollout v3 is aborted", code == 1, manager.text()[-300:])
    wave1 = set(order[: wave_size(WAVES_BAD[0], len(fleet))])
    breaches = [e for e in events if e["event"] == "gate_breached"]
    c.check(
        "the gate breaks in wave 1, on p95",
        bool(breaches)
        and breaches[0]["wave"] == 0
        and "p95_ms" in " ".join(breaches[0]["breaches"]),
        breaches[:1],
    )
    aborted = next((e for e in events if e["event"] == "aborted"), {})
    c.check("exactly wave 1 is rolled back", set(aborted.get("rolling_back", [])) == wave1)
    log = summary["log"]
    sent = {d: [e for e in log.get(d, []) if e[0].startswith(f"{BAD_ID}.")] for d in fleet}
    c.check(
        "each touched device: activate v3, then back to v2, once each",
        all(
            [(e[0].split(".")[-2], e[1], e[2], e[3]) for e in sent[d]]
            == [("deploy", "activate", 3, True), ("rollback", "activate", 2, True)]
            for d in wave1
        ),
    )
    c.check("no other device was sent anything", not any(sent[d] for d in fleet if d not in wave1))
    done = next((e for e in events if e["event"] == "rolled_back"), {})
    c.check(
        "every rollback succeeded",
        done.get("succeeded") == len(wave1)
        and not done.get("failed")
        and not done.get("not_reached"),
        done,
    )
    c.check("every device serves v2 again", summary["serving"] == {"2": len(fleet)})
    report.figures["rollout_bad_s"] = done.get("duration_s")
    report.figures["regressing_in_wave_1"] = len(wave1 & regress)
    report.figures["wave_1_devices"] = len(wave1)


def _timed(work: Callable[[], object]) -> float:
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _store_before_after(report: Report, db: Path) -> None:
    """The driver's store, on the stored state: before (asdict at every tick) and now."""
    rollout = Rollout.from_json(rollout_state(db, OK_ID))

    def dumps(doc: dict[str, Any]) -> str:
        return json.dumps(doc, separators=(",", ":"), sort_keys=True, default=str)

    def before() -> str:
        jobs = {d: dataclasses.asdict(j) for d, j in rollout.jobs.items()}
        return dumps({**rollout.to_json(), "jobs": jobs})

    old_s, new_s = _timed(before), _timed(lambda: dumps(rollout.to_json()))
    report.figures["store"] = {
        "jobs": len(rollout.jobs),
        "bytes": len(dumps(rollout.to_json())),
        "before_s": round(old_s, 3),
        "after_s": round(new_s, 3),
        "before_s_per_s": round(old_s / TICK_S, 2),  # every tick
        "after_s_per_s": round(new_s, 2),  # at most once a second between decisions
    }


def _tables(report: Report, opts: Options) -> None:
    f = report.figures
    procs: list[list[object]] = [["process", "wall s", "CPU s", "CPU %", "peak RSS MiB"]]
    for key, label in (
        ("inventory", "fleet inventory"),
        ("rollout_ok", "fleet rollout (v2)"),
        ("rollout_bad", "fleet rollout (v3, aborted)"),
        ("simulator", "simulator"),
    ):
        if key in f:
            procs.append([label, *_usage(Usage(**f[key]))])
    report.tables.insert(0, f"processes:\n{table(procs)}")
    during = f.get("cpu_during_rollout_percent", {})
    peak = f.get("peak_rss_mb", {})
    busy: list[list[object]] = [["process", "CPU % during rollout v2", "peak RSS MiB"]]
    busy += [[name, during.get(name), peak.get(name)] for name in during]
    report.tables.append(f"long-running processes:\n{table(busy)}")
    msgs = f.get("broker_messages_per_s", {})
    store = f.get("store", {})
    other: list[list[object]] = [
        ["figure", "value"],
        ["devices connected in s", f.get("connect_s")],
        ["telemetry interval s", opts.telemetry_s],
        [
            "broker PUBLISH/s in, out (rollout v2)",
            f"{msgs.get('publish/messages/received')}, {msgs.get('publish/messages/sent')}",
        ],
        [
            "broker packets/s in, out (acks included)",
            f"{msgs.get('messages/received')}, {msgs.get('messages/sent')}",
        ],
        ["rollout v2 s (all waves, soaks)", f.get("rollout_ok_s")],
        ["rollout v3 s (abort + rollback)", f.get("rollout_bad_s")],
        [
            "regressing devices in v3's wave 1",
            f"{f.get('regressing_in_wave_1')} of {f.get('wave_1_devices')}",
        ],
    ]
    for i, e in enumerate(f.get("exporters", [])):
        other.append(
            [
                f"exporter {i + 1}: devices, scrape s, bytes",
                f"{e['devices']}, {e['scrape_s']}, {e['bytes']:,}",
            ]
        )
    d = f.get("dashboard", {})
    other.append(["dashboard state s, bytes", f"{d.get('state_s')}, {d.get('state_bytes')}"])
    if "first_paint_ms" in d:
        other.append(
            [
                "dashboard first paint ms: paged, whole table (before)",
                f"{d['first_paint_ms']}, {d['baseline_first_paint_ms']}",
            ]
        )
        other.append(
            [
                "dashboard DOM complete ms: paged, whole table (before)",
                f"{d['dom_complete_ms']}, {d['baseline_dom_complete_ms']}",
            ]
        )
        other.append(
            [
                "dashboard page bytes: paged, whole table (before)",
                f"{d['page_bytes']:,}, {d['baseline_page_bytes']:,}",
            ]
        )
    if store:
        other.append(
            [
                f"store {store['jobs']} jobs ({store['bytes']:,} B) s: before, after",
                f"{store['before_s']}, {store['after_s']}",
            ]
        )
        other.append(
            [
                "store work per s of driving: before, after",
                f"{store['before_s_per_s']}, {store['after_s_per_s']}",
            ]
        )
    report.tables.append(table(other))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every check held."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet10k",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--telemetry", type=float, default=10.0, help="seconds (10)")
    parser.add_argument("--soak", type=float, default=20.0, help="seconds per wave (20)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    parser.add_argument("--no-browser", action="store_true", help="skip the first paint")
    args = parser.parse_args(argv)
    opts = Options(args.devices, args.telemetry, args.soak, not args.no_browser)
    folder = Path(tempfile.mkdtemp(prefix="fleet10k-"))
    try:
        report = run_scenario(opts, folder)
    finally:
        if args.keep:
            print(f"logs in {folder}")
        else:
            import shutil  # noqa: PLC0415

            shutil.rmtree(folder, ignore_errors=True)
    for text in report.tables:
        print(f"\n{text}")
    print(f"\nchecks:\n{report.checks.table()}")
    if args.out:
        args.out.write_text(json.dumps(report.figures, indent=2, sort_keys=True) + "\n")
    return 1 if report.checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
