"""Power cuts at the durable points of the real stores, each followed by a reboot and checks.

Every durable point (each fsync the run made) of a small run of each store is cut with all
unsynced state dropped, and a sample is cut again with it torn; `reboot.py` says what is
checked after each. `make powercut` runs the same at >= 10,000 cuts (`campaign.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.powercut.cutrun import CutReport, cut, record


def _assert_clean(*reports: CutReport) -> None:
    for report in reports:
        print(report.summary())
        shown = [f"k={v.k} ({v.mode}): {'; '.join(v.problems)}" for v in report.violations[:5]]
        assert not report.violations, "\n".join(shown)


@pytest.mark.usefixtures("fuse_ready")
def test_model_cache_serves_a_complete_version_after_a_cut_at_every_durable_point(
    tmp_path: Path,
) -> None:
    journal = record("cache", tmp_path)
    assert len(journal.durable_indices) > 100  # installs, activations, GC: each fsync is cut
    everywhere = cut(journal, "cache", tmp_path)
    torn = cut(journal, "cache", tmp_path, drop=False, torn=1, sample=40, seed=1)
    assert everywhere.cuts == len(journal.durable_indices) + 1
    _assert_clean(everywhere, torn)


@pytest.mark.usefixtures("fuse_ready")
def test_sync_state_and_provenance_stay_consistent_with_the_cache(tmp_path: Path) -> None:
    journal = record("sync", tmp_path)
    _assert_clean(cut(journal, "sync", tmp_path, torn=1, sample=30, seed=2))


@pytest.mark.usefixtures("fuse_ready")
def test_outbox_keeps_every_event_reported_stored(tmp_path: Path) -> None:
    journal = record("outbox", tmp_path)
    report = cut(journal, "outbox", tmp_path, torn=1, seed=3)
    assert report.cuts == 2 * (len(journal.durable_indices) + 1)
    _assert_clean(report)


@pytest.mark.usefixtures("fuse_ready")
def test_rollout_store_keeps_waves_done_and_resume_finishes(tmp_path: Path) -> None:
    journal = record("rollout", tmp_path)
    _assert_clean(cut(journal, "rollout", tmp_path, torn=2, seed=4))
