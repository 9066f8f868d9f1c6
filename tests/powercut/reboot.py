"""The reboot after a cut: open each store afresh on the image a cut left, and check it.

    python -m tests.powercut.reboot STORE AUX < cuts.json     # [[image, [mark, ...]], ...]

Runs as a process of its own (started once per batch of images; each image is opened with new
objects and connections, as a board's next boot would), prints one JSON list of violations per
image. A violation is a sentence; an empty list means every invariant held:

    cache    the cache opens; each model serves one complete version (every file byte for byte
             as installed, the config included) and the database says the same; that version
             is the last one reported active, or the one being activated at the cut; versions
             reported installed are still there, unless the GC that was running evicted them;
             a GC after the reboot keeps serving the same.
    sync     as cache for what the sync installed; every version the cache holds has a readable
             provenance record naming it; the next sync cycle succeeds and serves the newest
             published version, with its record.
    outbox   every event reported stored and not acknowledged (nor being acknowledged at the
             cut) is delivered after the reboot, intact; none reported acknowledged is
             delivered again; a new event's seq is
             above every reported one; reported commands are remembered (with their response
             once finished); the desired state is the last one reported, or the one being set.
    rollout  the rollout reported created exists; its wave, phase and succeeded jobs are at
             least what the last reported save said; resumed, it finishes with every device
             on the new version, and each wave's "wave_deployed" event is stored exactly once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.powercut import workloads as w


def _served(repository: Path) -> dict[str, tuple[int, dict[str, bytes], bytes]]:
    """model → (version, files of VERSION/ by relative path, config bytes), read through the
    symlinks the way a Triton repository reader does."""
    found: dict[str, tuple[int, dict[str, bytes], bytes]] = {}
    if not repository.is_dir():
        return found
    for model_dir in sorted(repository.iterdir()):
        versions = [p for p in model_dir.iterdir() if p.name.isdigit()]
        if len(versions) != 1:
            raise AssertionError(f"{model_dir.name} serves {len(versions)} versions")
        files = {
            p.relative_to(versions[0]).as_posix(): p.read_bytes()
            for p in sorted(versions[0].rglob("*"))
            if p.is_file()
        }
        config = (model_dir / "config.pbtxt").read_bytes()
        found[model_dir.name] = (int(versions[0].name), files, config)
    return found


def _reported(marks: Sequence[str], prefix: str) -> list[list[str]]:
    return [m.split(":")[1:] for m in marks if m.split(":")[0] == prefix]


def _check_served(cache: Any, allowed: dict[str, set[int | None]]) -> list[str]:
    problems: list[str] = []
    try:
        served = _served(cache.repository_path)
    except (OSError, AssertionError) as exc:
        return [f"the served repository cannot be read: {exc}"]
    db = {m: v.version for m, v in cache.served().items()}
    if db != {m: v for m, (v, _f, _c) in served.items()}:
        problems.append(f"the view serves {sorted(served.items())!r:.200} but the database {db}")
    for model in sorted(allowed.keys() | served.keys()):
        version = served[model][0] if model in served else None
        if version not in allowed.get(model, {None}):
            problems.append(f"{model} serves version {version}, expected one of {allowed[model]}")
        if model in served:
            _v, files, config = served[model]
            if config != w.cache_config(model):
                problems.append(f"{model} v{version}: config.pbtxt differs from the installed one")
            if files != w.cache_files(model, _v):
                problems.append(f"{model} v{version}: files differ from the installed ones")
    return problems


def check_cache(image: Path, _aux: Path, marks: Sequence[str]) -> list[str]:
    """The cache invariants (module docstring)."""
    from model_cache import ModelCache, VersionState, collect

    try:
        cache = ModelCache(image / "cache")
    except Exception as exc:
        return [f"the cache does not open: {type(exc).__name__}: {exc}"]
    try:
        problems: list[str] = []
        allowed: dict[str, set[int | None]] = {}
        reported_active = {m: [int(v) for mm, v in _reported(marks, "active") if mm == m]
                           for m in w.CACHE_MODELS}  # fmt: skip
        for model in w.CACHE_MODELS:
            targets = [v for op, m, v in w.CACHE_SCRIPT if m == model and op != "install"]
            n = len(reported_active[model])
            allowed[model] = {targets[n - 1] if n else None}
            if n < len(targets):
                allowed[model].add(targets[n])
        problems += _check_served(cache, allowed)
        gc_began = "gc-begin" in marks
        keep = {VersionState.READY, VersionState.ACTIVE, VersionState.RETIRED}
        for model, version in ((m, int(v)) for m, v in _reported(marks, "installed")):
            if gc_began and (model, version) in w.CACHE_GC_EVICTS:
                continue
            states = {v.version: v.state for v in cache.list_versions(model)}
            if states.get(version) not in keep:
                problems.append(
                    f"{model} v{version} was reported installed, is now {states.get(version)}"
                )
        collect(cache, keep_last=1)
        problems += [f"after a GC: {p}" for p in _check_served(cache, allowed)]
        return problems
    finally:
        cache.close()


def check_sync(image: Path, aux: Path, marks: Sequence[str]) -> list[str]:
    """The sync invariants (module docstring)."""
    from model_cache import VersionState
    from tests.sync.support import payload

    try:
        world = w.sync_world(image, aux, create=False)
    except Exception as exc:
        return [f"the cache does not open: {type(exc).__name__}: {exc}"]
    cache = world.cache
    try:
        problems: list[str] = []

        def served_payload() -> tuple[int | None, bytes | None]:
            active = cache.active_version(w.SYNC_MODEL)
            if active is None:
                return None, None
            data = cache.repository_path / w.SYNC_MODEL / str(active.version) / "model.onnx"
            return active.version, data.read_bytes()

        n = len(_reported(marks, "active"))
        allowed = {w.SYNC_VERSIONS[n - 1] if n else None}
        if n < len(w.SYNC_VERSIONS):
            allowed.add(w.SYNC_VERSIONS[n])
        version, data = served_payload()
        if version not in allowed:
            problems.append(f"serves version {version}, expected one of {allowed}")
        if version is not None and data != payload(version, w.SYNC_BYTES):
            problems.append(f"v{version}: model.onnx differs from the published one")
        for model, reported in _reported(marks, "installed"):
            states = {v.version: v.state for v in cache.list_versions(model)}
            if states.get(int(reported)) is VersionState.FAILED or int(reported) not in states:
                problems.append(f"v{reported} was reported installed, is now missing or failed")

        def provenance() -> list[str]:
            found = []
            for item in cache.list_versions(w.SYNC_MODEL):
                if item.state is VersionState.FAILED:
                    continue
                record = world.client().provenance.get(item.model, item.version)
                if record is None or (record.model, record.version) != (item.model, item.version):
                    found.append(f"v{item.version} is {item.state.value} without provenance")
            return found

        problems += provenance()
        report = world.client().sync_once()
        if report.errors:
            problems.append(f"the next sync failed: {report.errors}")
        for model, active in report.activate:
            cache.activate(model, active)
        version, data = served_payload()
        if version != w.SYNC_VERSIONS[-1] or data != payload(version, w.SYNC_BYTES):
            problems.append(f"after the next sync: serves v{version}, not the newest published")
        problems += [f"after the next sync: {p}" for p in provenance()]
        return problems
    finally:
        cache.close()


def check_outbox(image: Path, _aux: Path, marks: Sequence[str]) -> list[str]:
    """The outbox and command-state invariants (module docstring)."""
    from agent.fleet.outbox import Outbox
    from agent.fleet.state import FleetState

    try:
        outbox = Outbox(w.fleet_db(image), max_messages=w.OUTBOX_BOUND)
        state = FleetState(w.fleet_db(image))
    except Exception as exc:
        return [f"the fleet database does not open: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    stored = {int(seq): int(i) for seq, i in _reported(marks, "stored")}
    acked = {int(s) for (seqs,) in _reported(marks, "acked") for s in seqs.split(",") if s}
    # Rows being acknowledged at the cut were delivered already; their delete may have reached
    # the disk without its fsync (a torn cut keeps unsynced writes), so they may be gone.
    acking = {int(s) for (seqs,) in _reported(marks, "acking") for s in seqs.split(",") if s}
    delivered: dict[int, dict[str, Any]] = {}
    while rows := outbox.take(outbox.max_take):
        for row in rows:
            delivered[row.seq] = json.loads(row.payload)
        outbox.ack(r.seq for r in rows)
    for seq in sorted(set(stored) - acked - acking - set(delivered)):
        problems.append(f"event seq {seq} was reported stored and is lost")
    for seq in sorted(acked & set(delivered)):
        problems.append(f"event seq {seq} was acknowledged and is delivered again")
    for seq, body in sorted(delivered.items()):
        i = stored.get(seq, int(body.get("i", -1)))
        if body != {**w.outbox_body(int(i)), "seq": seq}:
            problems.append(f"event seq {seq} is delivered damaged: {str(body)[:80]}")
    newest = max(stored, default=0)
    seq = outbox.put("event", "edge/d1/events", w.outbox_body(-1))
    if seq <= newest:
        problems.append(f"a new event got seq {seq}, not above the reported {newest}")
    for (command,) in _reported(marks, "begun"):
        if state.seen(command) is None:
            problems.append(f"command {command} was begun and is forgotten: it would run twice")
    for (command,) in _reported(marks, "finished"):
        seen = state.seen(command)
        if seen is None or seen.response != {"ok": True, "i": int(command[1:])}:
            problems.append(f"command {command} finished; its response is lost ({seen})")
    desired = [int(i) for (i,) in _reported(marks, "desired")]
    script = [i for i in range(w.OUTBOX_EVENTS) if i % 10 == 7]
    allowed = {desired[-1] if desired else None}
    if len(desired) < len(script):
        allowed.add(script[len(desired)])
    now = state.desired()
    got = int(now[0][1][1:]) if now else None
    if got not in allowed:
        problems.append(f"the desired state is {now}, expected one of {allowed}")
    outbox.close()
    state.close()
    return problems


def check_rollout(image: Path, _aux: Path, marks: Sequence[str]) -> list[str]:
    """The rollout-store invariants (module docstring)."""
    from agent.manager.rollout_store import RolloutStore

    try:
        store = RolloutStore(w.rollout_db(image))
    except Exception as exc:
        return [f"the rollout database does not open: {type(exc).__name__}: {exc}"]
    try:
        rollout = store.load(w.ROLLOUT_ID)
        problems: list[str] = []
        if rollout is None:
            return ["the rollout was reported created and is gone"] if "created" in marks else []
        saves = _reported(marks, "saved")
        succeeded = {d for d, j in rollout.jobs.items() if j.state == "succeeded"}
        if saves:
            wave, phase, done = saves[-1]
            if rollout.wave < int(wave) or len(succeeded) < int(done):
                problems.append(
                    f"the last save reported wave {wave} with {done} devices done; the store "
                    f"has wave {rollout.wave} with {len(succeeded)}"
                )
            if phase == "succeeded" and rollout.phase != "succeeded":
                problems.append(f"the rollout was reported succeeded, is now {rollout.phase}")
        devices = w.SimulatedFleet({d: 2 for d in succeeded})
        devices.send(rollout.resend())
        now = max([rollout.started_at, rollout.wave_started_at, rollout.soak_started_at or 0.0])
        w.drive(store, rollout, devices, now + 1, None)
        if rollout.phase != "succeeded" or len(rollout.jobs) != w.ROLLOUT_DEVICES:
            problems.append(f"resumed, the rollout ended {rollout.phase}: {rollout.reason}")
        if any(j.state != "succeeded" for j in rollout.jobs.values()):
            problems.append("resumed, not every device succeeded")
        waves = [e["wave"] for _n, e in store.events(w.ROLLOUT_ID) if e["event"] == "wave_deployed"]
        if sorted(waves) != list(range(len(rollout.spec.waves))):
            problems.append(f"wave_deployed events for waves {waves}: each wave once expected")
        return problems
    finally:
        store.close()


CHECKS: dict[str, Callable[[Path, Path, Sequence[str]], list[str]]] = {
    "cache": check_cache,
    "sync": check_sync,
    "outbox": check_outbox,
    "rollout": check_rollout,
}


def main() -> None:
    """Check each image named on stdin; print one JSON list of violations per image."""
    store, aux = sys.argv[1], Path(sys.argv[2])
    results = []
    for image, marks in json.load(sys.stdin):
        try:
            results.append(CHECKS[store](Path(image), aux, marks))
        except Exception as exc:
            results.append([f"the check itself failed: {type(exc).__name__}: {exc}"])
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
