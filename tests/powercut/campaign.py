"""The long power-cut run (`make powercut`): at least 10,000 cuts across the four stores.

    python -m tests.powercut.campaign --cuts 10000 [--work DIR] [--seed N]

Each store's workload is recorded once on the power-cut file system; then every durable point
is cut with the unsynced state dropped, and the rest of the store's share of cuts are torn
cuts at durable points drawn at random (each tears differently). Prints one Markdown table
(the figures of bench/powercut.md) and every violation; exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.powercut.cutrun import CutReport, cut, record
from tests.powercut.mount import fuse_unavailable

#: Share of the cuts per store (the cache and the sync have the most durable points).
SHARES = {"cache": 0.35, "sync": 0.2, "outbox": 0.25, "rollout": 0.2}


def run_store(store: str, cuts: int, work: Path, seed: int, jobs: int) -> list[CutReport]:
    """Every durable point dropped, then torn cuts up to `cuts` in all."""
    journal = record(store, work)
    reports = [cut(journal, store, work, jobs=jobs)]
    points = len(journal.durable_indices) + 1
    left = cuts - reports[0].cuts
    while left > 0:
        per_point = max(1, min(10, left // points))
        sample = min(points, max(1, left // per_point))
        reports.append(
            cut(
                journal,
                store,
                work,
                drop=False,
                torn=per_point,
                sample=sample,
                seed=seed,
                jobs=jobs,
            )
        )
        left -= reports[-1].cuts
        seed += 1
    return reports


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; 0 when no invariant was broken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=10_000, help="cuts in all (default 10000)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temp folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="reboot checks at once (default 2)")
    args = parser.parse_args(argv)
    reason = fuse_unavailable()
    if reason is not None:
        print(f"power-cut campaign needs FUSE: {reason}", file=sys.stderr)
        return 2
    base = args.work or Path(tempfile.mkdtemp(prefix="powercut-"))
    rows: list[tuple[str, int, int, int, int, int, float]] = []
    violations = []
    started = time.monotonic()
    for store, share in SHARES.items():
        work = base / store
        shutil.rmtree(work, ignore_errors=True)
        reports = run_store(store, round(args.cuts * share), work, args.seed, args.jobs)
        cuts = sum(r.cuts for r in reports)
        torn = sum(r.torn_cuts for r in reports)
        found = [v for r in reports for v in r.violations]
        seconds = sum(r.seconds for r in reports)
        rows.append(
            (store, reports[0].ops, reports[0].durable_points, cuts, torn, len(found), seconds)
        )
        violations += [(store, v) for v in found]
        print(f"{store}: {cuts} cuts, {len(found)} violations, {seconds:.0f} s", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    print(
        "| store | ops recorded | durable points | cuts | of which torn | violations | s | ms/cut |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for store, ops, points, cuts, torn, bad, seconds in rows:
        print(f"| {store} | {ops} | {points} | {cuts} | {torn} | {bad} | {seconds:.0f} | "
              f"{1000 * seconds / max(cuts, 1):.0f} |")  # fmt: skip
    total = sum(r[3] for r in rows)
    print(f"| all | | | {total} | {sum(r[4] for r in rows)} | {len(violations)} | "
          f"{time.monotonic() - started:.0f} | |")  # fmt: skip
    for store, v in violations[:50]:
        print(f"{store} k={v.k} ({v.mode}): {'; '.join(v.problems)}")
    if args.work is None:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
