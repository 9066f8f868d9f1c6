"""Crashes at every step of install and activate, then recovery on the next open.

Two ways to crash: a fault hook that raises (the in-process object is then abandoned and the
root reopened, as a restart would), and a child process that SIGKILLs itself at the step, so
no `finally`, no rollback and no close runs. Either way the next open must serve a complete
version, the old one or the new one, and leave nothing half-written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from model_cache import (
    ACTIVATE_STEPS,
    INSTALL_STEPS,
    CacheError,
    CorruptBlobError,
    InvalidVersionError,
    ModelCache,
    VersionState,
)
from tests.model_cache.support import (
    Crash,
    MakeSource,
    OpenCache,
    assert_clean,
    crash_at,
    ready_and_active,
    served,
    tamper,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_crash_during_install_recovers_a_complete_state(
    open_cache: OpenCache, src: MakeSource, step: str
) -> None:
    cache = open_cache()
    cache.install("m", 1, src(1))
    cache.activate("m", 1)

    with pytest.raises(Crash):
        cache.install("m", 2, src(2), fault=crash_at(step))
    cache.close()
    cache = open_cache()

    assert served(cache) == {"m": {1: b"m v1"}}
    assert_clean(cache)
    states = {v.version: v.state for v in cache.list_versions("m")}
    expected = {
        "blobs-written": None,
        "db-staged": VersionState.FAILED,
        "staged": VersionState.FAILED,
        "renamed": VersionState.READY,
        "db-ready": VersionState.READY,
    }[step]
    assert states.get(2) is expected
    assert cache.install("m", 2, src(2)).state is VersionState.READY
    cache.activate("m", 2)
    assert served(cache) == {"m": {2: b"m v2"}}


@pytest.mark.parametrize("step", ACTIVATE_STEPS)
def test_crash_during_activate_serves_old_or_new_never_half(
    open_cache: OpenCache, src: MakeSource, step: str
) -> None:
    cache = open_cache()
    ready_and_active(cache, src)

    with pytest.raises(Crash):
        cache.activate("m", 2, fault=crash_at(step))
    cache.close()
    cache = open_cache()

    # The database commit is activation's commit point.
    expected = 2 if step == "db-active" else 1
    assert served(cache) == {"m": {expected: f"m v{expected}".encode()}}
    assert cache.active_version("m").version == expected  # type: ignore[union-attr]
    assert_clean(cache)


@pytest.mark.parametrize("step", ACTIVATE_STEPS)
def test_crash_during_rollback_serves_old_or_new(
    open_cache: OpenCache, src: MakeSource, step: str
) -> None:
    cache = open_cache()
    ready_and_active(cache, src)
    cache.activate("m", 2)

    with pytest.raises(Crash):
        cache.rollback("m", fault=crash_at(step))
    cache.close()
    cache = open_cache()

    expected = 1 if step == "db-active" else 2
    assert served(cache) == {"m": {expected: f"m v{expected}".encode()}}
    assert_clean(cache)


_KILL_SCRIPT = """
import os, signal, sys
from pathlib import Path
from model_cache import ModelCache

root, source, op, step = sys.argv[1:5]

def hook(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)

cache = ModelCache(Path(root))
if op == "install":
    cache.install("m", 2, Path(source), fault=hook)
else:
    cache.activate("m", 2, fault=hook)
sys.exit(3)
"""


@pytest.mark.parametrize(
    ("op", "step"),
    [("install", s) for s in INSTALL_STEPS] + [("activate", s) for s in ACTIVATE_STEPS],
)
def test_sigkill_at_each_step_recovers(
    open_cache: OpenCache, src: MakeSource, cache_root: Path, op: str, step: str
) -> None:
    cache = open_cache()
    cache.install("m", 1, src(1))
    cache.activate("m", 1)
    if op == "activate":
        cache.install("m", 2, src(2))
    source = src(2)
    cache.close()

    killed = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, str(cache_root), str(source), op, step],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()

    cache = open_cache()
    expected = 2 if (op, step) == ("activate", "db-active") else 1
    assert served(cache) == {"m": {expected: f"m v{expected}".encode()}}
    assert_clean(cache)
    cache.install("m", 2, source)
    cache.activate("m", 2)
    assert served(cache) == {"m": {2: b"m v2"}}


def test_recovery_removes_leftovers(open_cache: OpenCache, src: MakeSource) -> None:
    cache = open_cache()
    cache.install("m", 1, src(1))
    cache.activate("m", 1)
    layout = cache.layout
    cache.close()
    (layout.staging_dir / "deadbeef" / "1").mkdir(parents=True)
    (layout.blob_tmp_dir / ".tmp-blob-1234").write_bytes(b"half")
    (layout.model_dir("m") / "9-abcdefabcdef").mkdir()
    (layout.views_dir / "v00000099" / "m").mkdir(parents=True)
    (layout.root / ".tmp-repository-1234").symlink_to("views/v00000099")

    cache = open_cache()

    report = cache.last_recovery
    assert report.removed_temp == 5  # the four above and the previous view generation
    assert report.removed_orphans == ("m/9-abcdefabcdef",)
    assert not report.view_rebuilt
    assert served(cache) == {"m": {1: b"m v1"}}
    assert_clean(cache)


def test_recovery_rebuilds_a_missing_or_damaged_view(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache()
    cache.install("m", 1, src(1))
    cache.activate("m", 1)
    repository = cache.repository_path
    cache.close()
    repository.unlink()

    cache = open_cache()

    assert cache.last_recovery.view_rebuilt
    assert served(cache) == {"m": {1: b"m v1"}}
    assert [e.kind for e in cache.events()][-1] == "view-rebuilt"


def test_a_tampered_blob_fails_the_version_and_the_previous_one_is_served(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache()
    ready_and_active(cache, src)
    v2 = cache.activate("m", 2)
    blob = cache.blobs.path_of(cache.blobs.put_stream([b"m v2"]))
    cache.close()
    tamper(blob, b"m v3")  # same size: only the re-hash can tell

    cache = open_cache()

    failed = cache.get("m", 2)
    assert failed.state is VersionState.FAILED
    assert failed.reason is not None
    assert "2/model.onnx" in failed.reason
    assert cache.last_recovery.fallbacks == (("m", 2, 1),)
    assert served(cache) == {"m": {1: b"m v1"}}
    assert "auto-rollback" in [e.kind for e in cache.events()]
    assert not blob.exists()  # the corrupt blob is gone: no install can dedup onto it
    with pytest.raises(InvalidVersionError):
        cache.activate("m", 2)
    assert_clean(cache)
    # Re-installing the same content repairs it.
    assert cache.install("m", 2, src(2)).digest == v2.digest
    cache.activate("m", 2)
    assert served(cache) == {"m": {2: b"m v2"}}


def test_a_tampered_model_without_fallback_is_not_served(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache()
    version = cache.install("m", 1, src(1))
    cache.activate("m", 1)
    cache.close()
    tamper(version.version_dir / "model.onnx", b"changed length")

    cache = open_cache()

    assert cache.get("m", 1).state is VersionState.FAILED
    assert served(cache) == {}
    assert [e.kind for e in cache.events()][-2:] == ["unserved", "view-rebuilt"]


def test_a_tampered_retired_version_is_caught_at_rollback(
    cache: ModelCache, src: MakeSource
) -> None:
    ready_and_active(cache, src)
    v1 = cache.get("m", 1)
    cache.activate("m", 2)
    tamper(v1.version_dir / "model.onnx", b"m vX")
    cache.recover()  # retired versions are only checked for structure at open

    with pytest.raises(CorruptBlobError):
        cache.rollback("m")

    assert cache.get("m", 1).state is VersionState.FAILED
    assert served(cache) == {"m": {2: b"m v2"}}


def test_an_extra_file_in_a_version_fails_it(open_cache: OpenCache, src: MakeSource) -> None:
    cache = open_cache()
    version = cache.install("m", 1, src(1))
    cache.activate("m", 1)
    cache.close()
    os.chmod(version.version_dir, 0o755)
    (version.version_dir / "injected.so").write_bytes(b"x")

    cache = open_cache()

    assert cache.get("m", 1).state is VersionState.FAILED
    assert "injected.so" in (cache.get("m", 1).reason or "")
    assert served(cache) == {}


def test_runtime_verify_unserves_a_corrupt_active_version(
    cache: ModelCache, src: MakeSource
) -> None:
    version = cache.install("m", 1, src(1))
    cache.activate("m", 1)
    assert cache.verify("m", 1)

    tamper(version.version_dir / "model.onnx", b"m vX")

    assert not cache.verify("m", 1)
    assert served(cache) == {}


def test_reusing_a_crashed_cache_object_asks_for_a_reopen(
    cache: ModelCache, src: MakeSource
) -> None:
    with pytest.raises(Crash):
        cache.install("m", 1, src(1), fault=crash_at("db-staged"))

    with pytest.raises(CacheError, match="interrupted"):
        cache.install("m", 1, src(1))


def test_a_fast_open_checks_structure_only(open_cache: OpenCache, src: MakeSource) -> None:
    cache = open_cache()
    version = cache.install("m", 1, src(1))
    cache.activate("m", 1)
    cache.close()
    tamper(version.version_dir / "model.onnx", b"m vX")  # same size

    cache = open_cache(verify_on_open=False)

    assert cache.get("m", 1).state is VersionState.ACTIVE
    assert not cache.verify("m", 1)
    assert served(cache) == {}
