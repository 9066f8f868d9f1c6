"""The runs whose every durable point gets cut: the real stores, driven on the power-cut mount.

    python -m tests.powercut.workloads STORE MOUNT AUX

Each run is a short script over the real code (no fakes): the model cache (install, activate,
roll back, GC), the signed sync (TUF refresh, downloads, provenance, install), the fleet link's
outbox and command state, and the manager's rollout store. What lives on the device's disk is
on MOUNT; what lives elsewhere (sources, the publisher's repository and bucket) in AUX. After
each call whose result the program would report (an event stored, a version active, a wave
saved) the run sends a mark (`mount.mark`): a cut after the mark must keep what it reported.
`reboot.py` holds the checks, and reads the scripts from here.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from tests.powercut.mount import mark

# -- the model cache ---------------------------------------------------------------------------

CACHE_MODELS = ("m", "n")
#: (operation, model, version): install / activate / rollback (to version) / gc (keep_last 1).
CACHE_SCRIPT: tuple[tuple[str, str, int], ...] = (
    ("install", "m", 1),
    ("activate", "m", 1),
    ("install", "n", 1),
    ("activate", "n", 1),
    ("install", "m", 2),
    ("activate", "m", 2),
    ("install", "m", 3),
    ("activate", "m", 3),
    ("rollback", "m", 2),
    ("gc", "", 1),
    ("install", "m", 4),
    ("activate", "m", 4),
)
#: What the GC step evicts (keep_last=1: m's active 2 and its most recent retired 3 stay).
CACHE_GC_EVICTS = frozenset({("m", 1)})


def cache_files(model: str, version: int) -> dict[str, bytes]:
    """A version's files: its own weights (3 blocks and a bit) and labels every version shares."""
    seed = hashlib.sha256(f"{model}:{version}".encode()).digest()
    weights = (seed * (9000 // len(seed) + 1))[:9000]
    return {"model.onnx": weights, "labels.txt": f"labels of {model}\n".encode()}


def cache_config(model: str) -> bytes:
    """A model's config.pbtxt."""
    return f'name: "{model}"\nplatform: "onnxruntime_onnx"\n'.encode()


def _cache_source(aux: Path, model: str, version: int) -> Path:
    folder = aux / "src" / f"{model}-{version}"
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_bytes(cache_config(model))
    for name, data in cache_files(model, version).items():
        (folder / str(version) / name).write_bytes(data)
    return folder


def run_cache(mount: Path, aux: Path) -> None:
    """`CACHE_SCRIPT` on a cache at MOUNT/cache."""
    from model_cache import ModelCache, collect

    cache = ModelCache(mount / "cache")
    for op, model, version in CACHE_SCRIPT:
        if op == "install":
            cache.install(model, version, _cache_source(aux, model, version))
            mark(mount, f"installed:{model}:{version}")
        elif op == "activate":
            cache.activate(model, version)
            mark(mount, f"active:{model}:{version}")
        elif op == "rollback":
            assert cache.rollback(model).version == version
            mark(mount, f"active:{model}:{version}")
        else:
            mark(mount, "gc-begin")
            report = collect(cache, keep_last=version)
            assert {(m, v) for m, v, _why in report.evicted} == CACHE_GC_EVICTS, report
            mark(mount, "gc-done")
    cache.close()


# -- the signed sync ---------------------------------------------------------------------------

SYNC_MODEL = "m"
SYNC_VERSIONS = (1, 2, 3)
SYNC_BYTES = 12_000


def sync_world(mount_or_image: Path, aux: Path, *, create: bool) -> Any:
    """The publisher's side in AUX (keys made when `create`) and the device's cache and sync
    work folder on the given disk; returns a `tests.sync.support.World`."""
    from model_cache import ModelCache
    from sync.keys import init_keys
    from sync.store import FileStore
    from tests.sync.support import World

    if create:
        init_keys(aux / "repo", {})
    cache = ModelCache(mount_or_image / "cache")
    return World(
        aux / "repo",
        FileStore(aux / "bucket"),
        cache,
        mount_or_image / "cache" / "sync",
        aux / "src",
    )


def run_sync(mount: Path, aux: Path) -> None:
    """Publish a version, sync it and activate it; three times."""
    world = sync_world(mount, aux, create=True)
    for version in SYNC_VERSIONS:
        world.publish(SYNC_MODEL, version, size=SYNC_BYTES)
        report = world.client().sync_once()
        assert not report.errors, report.errors
        mark(mount, f"installed:{SYNC_MODEL}:{version}")
        for model, active in report.activate:
            world.cache.activate(model, active)
            mark(mount, f"active:{model}:{active}")
    world.cache.close()


# -- the fleet link's outbox and command state ---------------------------------------------------

OUTBOX_EVENTS = 42  # the last two are never acknowledged
OUTBOX_BOUND = 1000


def outbox_body(i: int) -> dict[str, Any]:
    """The i-th event's body."""
    return {"event": "swap", "i": i, "pad": "x" * 300}


def fleet_db(disk: Path) -> Path:
    """The fleet link's database on a disk."""
    return disk / "fleet" / "fleet.db"


def run_outbox(mount: Path, _aux: Path) -> None:
    """Events stored, some delivered and acknowledged; commands begun and finished; desired
    state set."""
    from agent.fleet.outbox import Outbox
    from agent.fleet.state import FleetState

    outbox = Outbox(fleet_db(mount), max_messages=OUTBOX_BOUND)
    state = FleetState(fleet_db(mount))
    for i in range(OUTBOX_EVENTS):
        seq = outbox.put("event", "edge/d1/events", outbox_body(i))
        mark(mount, f"stored:{seq}:{i}")
        if i % 5 == 4:
            rows = outbox.take(outbox.max_take)
            seqs = ",".join(str(r.seq) for r in rows)
            mark(mount, f"acking:{seqs}")
            outbox.ack(r.seq for r in rows)
            mark(mount, f"acked:{seqs}")
        if i % 10 == 3:
            assert state.begin(f"c{i}", "activate")
            mark(mount, f"begun:c{i}")
            state.finish(f"c{i}", {"ok": True, "i": i})
            mark(mount, f"finished:c{i}")
        if i % 10 == 7:
            state.set_desired((("m", f"={i}"),))
            mark(mount, f"desired:{i}")
    outbox.close()
    state.close()


# -- the fleet manager's rollout store -----------------------------------------------------------

ROLLOUT_DEVICES = 8
ROLLOUT_ID = "r1"


def rollout_db(disk: Path) -> Path:
    """The manager's rollout database on a disk."""
    return disk / "manager" / "rollouts.db"


def rollout_spec() -> Any:
    """The rollout every run drives: 8 devices in three waves, a short soak."""
    from agent.manager.rollout_plan import RolloutSpec

    return RolloutSpec(
        id=ROLLOUT_ID, model="m", version=2, group="site-a", waves=(0.25, 0.5, 1.0),
        soak_s=2, job_timeout_s=30,
    )  # fmt: skip


class SimulatedFleet:
    """Devices outside the manager's disk: they switch on an activate and answer once per
    command id (a resent id gets the same answer, as the device's command state gives)."""

    def __init__(self, on_version: dict[str, int] | None = None) -> None:
        from agent.manager.devices import Fleet

        self.fleet = Fleet()
        for i in range(ROLLOUT_DEVICES):
            device = f"d{i:02d}"
            self._status(device, (on_version or {}).get(device, 1))
        self.answers: list[tuple[str, str, dict[str, Any]]] = []

    def _status(self, device: str, version: int) -> None:
        self.fleet.update(
            {"kind": "status", "device": device, "state": "online", "groups": ["site-a"],
             "models": [{"name": "m", "versions": [version]}]}
        )  # fmt: skip

    def send(self, sends: list[Any]) -> None:
        """Devices act on commands; their answers arrive with the next `drain`."""
        for send in sends:
            self._status(send.device, int(send.args["version"]))
            self.answers.append((send.device, send.command_id, {"ok": True, "device": send.device}))

    def drain(self, rollout: Any) -> None:
        """Hand the answers that arrived to the rollout."""
        for device, command_id, response in self.answers:
            rollout.on_response(device, command_id, response)
        self.answers.clear()


def drive(store: Any, rollout: Any, devices: SimulatedFleet, now: float, mount: Path | None) -> Any:
    """The driver's loop (`rollout_driver.drive`), one step a second, until done."""
    for _ in range(400):
        devices.drain(rollout)
        devices.send(rollout.step(devices.fleet.devices, now))
        store.save(rollout, now)
        if mount is not None:
            done = sum(j.state == "succeeded" for j in rollout.jobs.values())
            mark(mount, f"saved:{rollout.wave}:{rollout.phase}:{done}")
        if rollout.done:
            return rollout
        now += 1
    raise AssertionError("the rollout did not finish")


def run_rollout(mount: Path, _aux: Path) -> None:
    """Create the rollout and drive it to the end."""
    from agent.manager.rollout import Rollout
    from agent.manager.rollout_store import RolloutStore

    store = RolloutStore(rollout_db(mount))
    devices = SimulatedFleet()
    rollout = store.create(Rollout.start(rollout_spec(), devices.fleet.devices, 0.0), 0.0)
    mark(mount, "created")
    drive(store, rollout, devices, 0.0, mount)
    store.close()


WORKLOADS = {"cache": run_cache, "sync": run_sync, "outbox": run_outbox, "rollout": run_rollout}

if __name__ == "__main__":
    WORKLOADS[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
