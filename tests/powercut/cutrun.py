"""Cut runs: record a workload on the power-cut mount once, then cut the power at its durable
points, reboot on each image and check the store's invariants.

    journal = record("outbox", work)                    # the workload, on FUSE, recorded
    report = cut(journal, "outbox", work, torn=2)       # every durable point, dropped + torn
    assert not report.violations

Recording once and replaying the journal to each cut point (as dm-log-writes replays do) makes
a cut cost one replay and one reboot check instead of one whole run of the workload. The
images of a batch are checked by one `reboot.py` process, then deleted.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.powercut.disk_model import CutPoint, DiskModel, Image, Journal, apply
from tests.powercut.image import materialize, same_content, scan
from tests.powercut.mount import PowerCutMount

REPO = Path(__file__).resolve().parents[2]
WORKLOAD_TIMEOUT_S = 300
BATCH = 40


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant broken after a cut: where, how the unsynced state was treated, what."""

    k: int
    mode: str  # "drop" or "torn"
    problems: tuple[str, ...]


@dataclass(slots=True)
class CutReport:
    """What the cuts of one journal came to."""

    store: str
    ops: int
    durable_points: int
    cuts: int = 0
    torn_cuts: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        """One line for logs and the benchmark table."""
        return (
            f"{self.store}: {self.ops} ops, {self.durable_points} durable points, "
            f"{self.cuts} cuts ({self.torn_cuts} torn), {len(self.violations)} violations, "
            f"{self.seconds:.1f} s"
        )


def record(store: str, work: Path, module: str = "tests.powercut.workloads") -> Journal:
    """Run a workload on a fresh power-cut mount and return its journal.

    `python -m MODULE [STORE] MOUNT AUX` runs it (STORE is left out when empty).

    Also checks the model against the FUSE layer: the journal replayed to its end must give
    exactly what the backing folder holds.

    Raises:
        AssertionError: The workload failed, or the model and the backing folder disagree.
    """
    aux = work / "aux"
    aux.mkdir(parents=True, exist_ok=True)
    with PowerCutMount(work / "disk") as disk:
        run = subprocess.run(
            [sys.executable, "-m", module, *([store] if store else []), str(disk.path), str(aux)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=WORKLOAD_TIMEOUT_S,
            check=False,
        )
    assert run.returncode == 0, f"the {store} workload failed:\n{run.stdout}\n{run.stderr}"
    journal = disk.journal
    model = DiskModel()
    for op in journal.ops:
        apply(model, op)
    differences = same_content(model.live(), scan(disk.backing))
    assert not differences, f"the model disagrees with the backing folder: {differences[:5]}"
    return journal


def _images(
    journal: Journal, points: list[CutPoint], drop: bool, torn: int, seed: int
) -> Iterator[tuple[CutPoint, str, Image]]:
    if drop:
        for point, image in journal.replay(points):
            yield point, "drop", image
    if torn:
        for point, image in journal.replay(points, random.Random(seed), variants=torn):
            yield point, "torn", image


def cut(
    journal: Journal,
    store: str,
    work: Path,
    *,
    drop: bool = True,
    torn: int = 0,
    sample: int | None = None,
    seed: int = 0,
    jobs: int = 1,
) -> CutReport:
    """Cut at durable points of `journal`, reboot on each image, check the invariants.

    Args:
        journal: From `record(store, work)` (its AUX folder is reused by the checks).
        store: "cache", "sync", "outbox" or "rollout".
        work: The folder `record` used.
        drop: Check the image that drops everything unsynced at each point.
        torn: Torn images per point (each keeps a random part of what was unsynced).
        sample: Cut at this many points chosen at random (None: at every durable point).
        seed: For the sample and the tearing.
        jobs: Batches checked at once (each in its own process).

    Returns:
        The figures and every violation found.
    """
    started = time.monotonic()
    points = journal.cut_points()
    if sample is not None and sample < len(points):
        points = sorted(random.Random(seed).sample(points, sample), key=lambda p: p.index)
    report = CutReport(store, len(journal.ops), len(journal.durable_indices))
    images_dir = work / "images"
    batch: list[tuple[CutPoint, str, Path]] = []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        pending: list[Future[list[tuple[CutPoint, str, list[str]]]]] = []
        for n, (point, mode, image) in enumerate(_images(journal, points, drop, torn, seed)):
            batch.append((point, mode, materialize(image, images_dir / f"{n:06d}")))
            if len(batch) >= BATCH:
                pending.append(pool.submit(_check, batch, store, work / "aux"))
                batch = []
            while len(pending) > jobs:  # bound the images on disk
                _merge(pending.pop(0).result(), report)
        if batch:
            pending.append(pool.submit(_check, batch, store, work / "aux"))
        for future in pending:
            _merge(future.result(), report)
    shutil.rmtree(images_dir, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


def _merge(results: list[tuple[CutPoint, str, list[str]]], report: CutReport) -> None:
    for point, mode, problems in results:
        report.cuts += 1
        report.torn_cuts += mode == "torn"
        if problems:
            report.violations.append(Violation(point.k, mode, tuple(problems)))


def _check(
    batch: list[tuple[CutPoint, str, Path]], store: str, aux: Path
) -> list[tuple[CutPoint, str, list[str]]]:
    """Reboot on each image of a batch, in one fresh process; the images are then deleted."""
    request = [[str(path), list(point.marks)] for point, _mode, path in batch]
    run = subprocess.run(
        [sys.executable, "-m", "tests.powercut.reboot", store, str(aux)],
        cwd=REPO,
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=60 + 10 * len(batch),
        check=False,
    )
    for _point, _mode, path in batch:
        shutil.rmtree(path, ignore_errors=True)
    if run.returncode != 0:
        raise AssertionError(f"the reboot checks crashed:\n{run.stderr[-3000:]}")
    results: list[list[str]] = json.loads(run.stdout)
    return [
        (point, mode, problems)
        for (point, mode, _path), problems in zip(batch, results, strict=True)
    ]
