"""What the power-cut runs found, each shown on its own: before the fix, each test here failed.

* The fleet stores (outbox, command state, rollouts) ran SQLite in WAL mode with
  `synchronous=NORMAL`: a cut lost every commit since the last checkpoint.
* `open_database` created the store's folder without fsyncing its parent: a cut on a fresh
  device lost the folder, and the database with it.
* A resumed download trusted its part file, which is never fsynced: a cut that tore it made
  the version fail its hash check for the whole cycle, instead of being fetched again.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from model_cache import ModelCache
from sync.keys import init_keys
from sync.store import FileStore
from tests.powercut.cutrun import REPO
from tests.powercut.image import materialize
from tests.powercut.mount import PowerCutMount
from tests.sync.support import World, payload

_STORES = """
import sys
from pathlib import Path
from agent.fleet.outbox import Outbox
from agent.fleet.state import FleetState
from agent.manager.rollout import Rollout
from agent.manager.rollout_store import RolloutStore
from tests.powercut import workloads as w
disk = Path(sys.argv[1])
outbox = Outbox(disk / "new" / "fleet" / "fleet.db", max_messages=100)
seq = outbox.put("event", "edge/d1/events", {"i": 1})
state = FleetState(disk / "new" / "fleet" / "fleet.db")
state.begin("c1", "activate")
devices = w.SimulatedFleet()
store = RolloutStore(disk / "other" / "manager" / "rollouts.db")
store.create(Rollout.start(w.rollout_spec(), devices.fleet.devices, 0.0), 0.0)
print(seq, flush=True)
sys.stdin.read()  # held open until the power is cut (SIGKILL)
"""


@pytest.mark.usefixtures("fuse_ready")
def test_fleet_stores_in_new_folders_keep_what_they_reported_at_a_cut(
    powercut: PowerCutMount, tmp_path: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _STORES, str(powercut.path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    seq = int(child.stdout.readline())  # the event is reported stored
    image = materialize(powercut.cut([child]), tmp_path / "image")

    from agent.fleet.outbox import Outbox
    from agent.fleet.state import FleetState
    from agent.manager.rollout_store import RolloutStore

    outbox = Outbox(image / "new" / "fleet" / "fleet.db", max_messages=100)
    assert [r.seq for r in outbox.take(10)] == [seq]
    state = FleetState(image / "new" / "fleet" / "fleet.db")
    assert state.seen("c1") is not None  # a redelivered c1 is not run a second time
    store = RolloutStore(image / "other" / "manager" / "rollouts.db")
    assert store.load("r1") is not None
    for opened in (outbox, state, store):
        opened.close()


def test_fleet_stores_commit_with_synchronous_full(tmp_path: Path) -> None:
    from agent.wire.sqlite import open_database

    db = open_database(tmp_path / "a" / "b" / "s.db", "CREATE TABLE IF NOT EXISTS t (x);")
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_a_torn_part_file_is_downloaded_again_in_the_same_cycle(tmp_path: Path) -> None:
    init_keys(tmp_path / "repo", {})
    with ModelCache(tmp_path / "cache", verify_on_open=False) as cache:
        world = World(
            tmp_path / "repo", FileStore(tmp_path / "bucket"), cache, tmp_path / "work",
            tmp_path / "src",
        )  # fmt: skip
        world.publish("m", 1, size=3 * 4096)
        data = payload(1, 3 * 4096)
        downloads = tmp_path / "work" / "downloads"
        downloads.mkdir(parents=True)
        torn = data[:4096] + bytes(4096)  # a cut kept the first block, not the second
        (downloads / f"{hashlib.sha256(data).hexdigest()}.part").write_bytes(torn)
        report = world.client().sync_once()
        assert report.errors == ()
        assert report.installed == (("m", 1),)
