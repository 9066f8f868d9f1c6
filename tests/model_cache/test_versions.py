"""ModelCache: install, activate, rollback, dedup, read-only folders, validation, limits."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from model_cache import (
    CacheError,
    CacheFullError,
    InvalidVersionError,
    ModelCache,
    VersionNotFoundError,
    VersionState,
)
from tests.model_cache.support import MakeSource, OpenCache, ready_and_active, served, tamper, tree

REPO_ROOT = Path(__file__).resolve().parents[2]


# Install ---------------------------------------------------------------------------------


def test_install_makes_a_ready_read_only_version(cache: ModelCache, src: MakeSource) -> None:
    source = src(1, {"model.onnx": b"weights", "sub/vocab.txt": b"a b c"})

    version = cache.install("m", 1, source)

    assert version.state is VersionState.READY
    assert version.path.parent == cache.layout.model_dir("m")
    assert tree(version.path) == [
        "1",
        "1/model.onnx",
        "1/sub",
        "1/sub/vocab.txt",
        "config.pbtxt",
        "manifest.json",
    ]
    assert (version.version_dir / "model.onnx").read_bytes() == b"weights"
    assert version.config_path.read_text() == (source / "config.pbtxt").read_text()
    for path in [version.path, *version.path.rglob("*")]:
        writable = stat.S_IMODE(path.stat().st_mode) & 0o222
        assert writable == 0, path


def test_version_files_are_hard_links_to_blobs(cache: ModelCache, src: MakeSource) -> None:
    version = cache.install("m", 1, src(1, {"model.onnx": b"weights"}))

    model_file = version.version_dir / "model.onnx"
    blob = cache.blobs.path_of(cache.blobs.put_stream([b"weights"]))
    assert model_file.stat().st_ino == blob.stat().st_ino
    assert model_file.stat().st_nlink == 2


def test_versions_sharing_a_file_share_its_inode(cache: ModelCache, src: MakeSource) -> None:
    shared = b"shared tokenizer " * 100
    v1 = cache.install("m", 1, src(1, {"model.onnx": b"one", "tok.bin": shared}))
    v2 = cache.install("m", 2, src(2, {"model.onnx": b"two", "tok.bin": shared}))

    assert (v1.version_dir / "tok.bin").stat().st_ino == (v2.version_dir / "tok.bin").stat().st_ino
    assert (v1.version_dir / "model.onnx").stat().st_ino != (
        v2.version_dir / "model.onnx"
    ).stat().st_ino
    # config.pbtxt is identical too: 4 distinct contents for 6 files.
    assert len(cache.blobs.digests()) == 4


def test_install_is_idempotent_for_the_same_content(cache: ModelCache, src: MakeSource) -> None:
    first = cache.install("m", 1, src(1))
    events = len(cache.events())

    again = cache.install("m", 1, src(1))

    assert again.digest == first.digest
    assert again.path == first.path
    assert len(cache.events()) == events


def test_a_version_number_cannot_change_content(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1, {"model.onnx": b"one"}))

    with pytest.raises(InvalidVersionError):
        cache.install("m", 1, src(1, {"model.onnx": b"other"}))


def test_install_ignores_other_versions_in_the_source(cache: ModelCache, src: MakeSource) -> None:
    source = src(1)
    (source / "2").mkdir()
    (source / "2" / "model.onnx").write_bytes(b"v2")

    version = cache.install("m", 1, source)

    assert sorted(p.name for p in version.path.iterdir()) == ["1", "config.pbtxt", "manifest.json"]


def test_missing_config_is_refused(cache: ModelCache, src: MakeSource) -> None:
    source = src(1)
    (source / "config.pbtxt").unlink()

    with pytest.raises(InvalidVersionError, match=r"config\.pbtxt"):
        cache.install("m", 1, source)
    assert cache.list_versions("m") == []


def test_missing_version_folder_is_refused(cache: ModelCache, src: MakeSource) -> None:
    with pytest.raises(InvalidVersionError, match="version folder"):
        cache.install("m", 2, src(1))


def test_missing_model_file_is_refused(cache: ModelCache, src: MakeSource) -> None:
    with pytest.raises(InvalidVersionError, match="model file"):
        cache.install("m", 1, src(1, {"weights.bin": b"x"}))
    assert cache.blobs.digests() == []


def test_default_model_filename_must_exist(cache: ModelCache, src: MakeSource) -> None:
    config = 'name: "m"\nbackend: "onnxruntime"\ndefault_model_filename: "net.onnx"\n'
    with pytest.raises(InvalidVersionError, match=r"net\.onnx"):
        cache.install("m", 1, src(1, {"model.onnx": b"x"}, config=config))

    assert cache.install("m", 2, src(2, {"net.onnx": b"x"}, config=config)).state is (
        VersionState.READY
    )


def test_an_ensemble_needs_no_model_file(cache: ModelCache, src: MakeSource) -> None:
    config = 'name: "e"\nplatform: "ensemble"\n'

    version = cache.install("e", 1, src(1, {}, model="e", config=config))

    assert tree(version.path) == ["1", "config.pbtxt", "manifest.json"]


def test_symlinks_in_the_source_are_refused(cache: ModelCache, src: MakeSource) -> None:
    source = src(1)
    (source / "1" / "link").symlink_to("/etc/passwd")

    with pytest.raises(InvalidVersionError, match="not a regular file"):
        cache.install("m", 1, source)


@pytest.mark.parametrize(("model", "version"), [("../x", 1), ("m", 0), ("m", -3)])
def test_bad_names_are_refused(
    cache: ModelCache, src: MakeSource, model: str, version: int
) -> None:
    with pytest.raises(InvalidVersionError):
        cache.install(model, version, src(1))


def test_version_size_cap(open_cache: OpenCache, src: MakeSource) -> None:
    cache = open_cache(max_version_bytes=100)

    with pytest.raises(CacheFullError):
        cache.install("m", 1, src(1, {"model.onnx": b"x" * 200}))
    assert cache.blobs.digests() == []


def test_disk_budget_refuses_installs_before_writing(
    open_cache: OpenCache, src: MakeSource
) -> None:
    cache = open_cache(disk_budget_bytes=2_000)
    cache.install("m", 1, src(1, {"model.onnx": b"a" * 1_000}))
    stored = cache.blobs.digests()

    with pytest.raises(CacheFullError) as caught:
        cache.install("m", 2, src(2, {"model.onnx": b"b" * 1_500}))

    assert caught.value.budget_bytes == 2_000
    assert cache.blobs.digests() == stored
    # Content already stored costs nothing, so this fits although the files add up to more.
    again = src(3, {"model.onnx": b"a" * 1_000, "copy.bin": b"a" * 1_000})
    assert cache.install("m", 3, again).state is VersionState.READY


# Activate and roll back -----------------------------------------------------------------


def test_activate_serves_the_version_in_triton_layout(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1, {"model.onnx": b"v1"}))

    active = cache.activate("m", 1)

    assert active.state is VersionState.ACTIVE
    assert cache.repository_path.is_symlink()
    assert served(cache) == {"m": {1: b"v1"}}
    config = (cache.repository_path / "m" / "config.pbtxt").read_text()
    assert config == active.config_path.read_text()


def test_nothing_is_served_before_activation(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1))

    assert cache.repository_path.is_dir()
    assert served(cache) == {}


def test_activating_a_new_version_retires_the_old(cache: ModelCache, src: MakeSource) -> None:
    ready_and_active(cache, src)

    cache.activate("m", 2)

    assert served(cache) == {"m": {2: b"m v2"}}
    states = {v.version: v.state for v in cache.list_versions("m")}
    assert states == {1: VersionState.RETIRED, 2: VersionState.ACTIVE}
    assert [e.kind for e in cache.events()][-1] == "activated"


def test_activation_keeps_other_models_served(cache: ModelCache, src: MakeSource) -> None:
    cache.install("a", 1, src(1, model="a"))
    cache.install("b", 1, src(1, model="b"))
    cache.activate("a", 1)
    cache.activate("b", 1)
    cache.install("a", 2, src(2, model="a"))

    cache.activate("a", 2)

    assert served(cache) == {"a": {2: b"a v2"}, "b": {1: b"b v1"}}


def test_the_repository_path_is_stable_and_swapped_atomically(
    cache: ModelCache, src: MakeSource
) -> None:
    ready_and_active(cache, src)
    path = cache.repository_path
    before = os.readlink(path)

    cache.activate("m", 2)

    assert cache.repository_path == path
    assert os.readlink(path) != before
    assert (cache.layout.root / before).is_dir()  # the previous view stays for readers
    assert len(list(cache.layout.views_dir.iterdir())) == 2


def test_activating_the_active_version_changes_nothing(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1))
    cache.activate("m", 1)
    link, events = os.readlink(cache.repository_path), len(cache.events())

    cache.activate("m", 1)

    assert os.readlink(cache.repository_path) == link
    assert len(cache.events()) == events


def test_rollback_goes_back_and_forth(cache: ModelCache, src: MakeSource) -> None:
    ready_and_active(cache, src)
    cache.activate("m", 2)

    assert cache.rollback("m").version == 1
    assert served(cache) == {"m": {1: b"m v1"}}
    assert cache.rollback("m").version == 2
    assert served(cache) == {"m": {2: b"m v2"}}
    assert [e.kind for e in cache.events()][-2:] == ["rolled-back", "rolled-back"]


def test_rollback_to_a_given_version(cache: ModelCache, src: MakeSource) -> None:
    for version in (1, 2, 3):
        cache.install("m", version, src(version))
        cache.activate("m", version)

    assert cache.rollback("m", to_version=1).version == 1
    assert served(cache) == {"m": {1: b"m v1"}}


def test_rollback_without_a_retained_version(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1))
    cache.activate("m", 1)

    with pytest.raises(VersionNotFoundError):
        cache.rollback("m")
    with pytest.raises(VersionNotFoundError):
        cache.rollback("m", to_version=7)


def test_unknown_and_failed_versions_cannot_be_activated(
    cache: ModelCache, src: MakeSource
) -> None:
    with pytest.raises(VersionNotFoundError):
        cache.activate("m", 1)
    version = cache.install("m", 1, src(1))
    tamper(version.version_dir / "model.onnx", b"evil")
    assert not cache.verify("m", 1)

    with pytest.raises(InvalidVersionError, match="failed"):
        cache.activate("m", 1)
    assert served(cache) == {}


def test_deactivate_stops_serving_a_model(cache: ModelCache, src: MakeSource) -> None:
    cache.install("m", 1, src(1))
    cache.activate("m", 1)

    retired = cache.deactivate("m")

    assert retired is not None
    assert retired.state is VersionState.RETIRED
    assert served(cache) == {}
    assert cache.deactivate("m") is None


def test_a_second_process_cannot_open_the_same_root(
    cache: ModelCache, open_cache: OpenCache
) -> None:
    with pytest.raises(CacheError, match="in use"):
        open_cache()
    cache.close()
    open_cache().close()


def test_the_state_database_is_in_wal_mode(cache: ModelCache) -> None:
    assert cache.journal_mode == "wal"
