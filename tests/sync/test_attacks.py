"""Each attack from the issue, against the S3-protocol server: refused, active version untouched."""

from __future__ import annotations

import datetime
import errno
import hashlib
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import TargetFile, Targets

from model_cache import ModelCache
from sync.errors import MetadataError, UnsafeTargetError
from sync.fetcher import Downloader
from sync.keys import utc_now
from sync.publish import Publisher, target_key
from tests.sync.support import World, active, files_under, make_model, payload


@pytest.fixture
def served_v1(world: World) -> World:
    """Version 1 published, synced and served; version 2 published."""
    world.publish("mlp", 1)
    world.sync_and_activate()
    assert active(world.cache, "mlp") == 1
    world.publish("mlp", 2)
    return world


def _key_of(world: World, path: str) -> str:
    info = world.local("targets").signed.targets[path]
    return target_key(info)


def _assert_untouched(world: World) -> None:
    assert active(world.cache, "mlp") == 1
    assert [v.version for v in world.cache.list_versions("mlp")] == [1]
    # The signed metadata and the provenance record of the installed version 1 belong there;
    # nothing of the refused version 2 may be left behind.
    kept = ("metadata", "provenance")
    leftovers = [p for p in files_under(world.work) if not set(kept) & set(p.parts)]
    assert leftovers == []
    assert not (world.work / "provenance" / "mlp" / "2.json").exists()


def test_tampered_file_is_refused(served_v1: World) -> None:
    key = _key_of(served_v1, "mlp/2/2/model.onnx")
    data = bytearray(served_v1.read_object(key))
    data[100] ^= 0xFF
    served_v1.upload_bytes(key, bytes(data))
    report = served_v1.client().sync_once()
    assert report.activate == ()
    assert any("hash" in reason.lower() for _m, reason in report.errors), report.errors
    _assert_untouched(served_v1)


def test_longer_file_is_cut_at_the_signed_length(served_v1: World) -> None:
    key = _key_of(served_v1, "mlp/2/2/model.onnx")
    served_v1.upload_bytes(key, payload(2) * 8)
    report = served_v1.client().sync_once()
    assert any("longer than its signed length" in r for _m, r in report.errors), report.errors
    assert report.downloaded_bytes <= len(payload(2)) + 4096
    _assert_untouched(served_v1)


def test_config_changed_without_resigning_is_refused(served_v1: World) -> None:
    key = _key_of(served_v1, "mlp/2/config.pbtxt")
    served_v1.upload_bytes(key, b'name: "mlp"\nplatform: "evil"\n')
    report = served_v1.client().sync_once()
    assert any("config.pbtxt" in r for _m, r in report.errors), report.errors
    _assert_untouched(served_v1)


def test_signed_config_digest_mismatch_is_refused(served_v1: World) -> None:
    def edit(targets: Targets) -> None:
        for path, info in targets.targets.items():
            if path.startswith("mlp/2/"):
                info.unrecognized_fields["custom"]["config_sha256"] = "0" * 64

    served_v1.forge_chain(edit)
    with pytest.raises(UnsafeTargetError, match="config digests"):
        served_v1.client().sync_once()
    _assert_untouched(served_v1)


def test_timestamp_signed_by_unknown_key_is_refused(served_v1: World) -> None:
    served_v1.forge_chain(timestamp_signers=[CryptoSigner.generate_ed25519()])
    with pytest.raises(MetadataError, match="timestamp"):
        served_v1.client().sync_once()
    _assert_untouched(served_v1)


def test_targets_signed_by_unknown_key_is_refused(served_v1: World) -> None:
    served_v1.forge_chain(targets_signers=[CryptoSigner.generate_ed25519()])
    with pytest.raises(MetadataError, match="targets"):
        served_v1.client().sync_once()
    _assert_untouched(served_v1)


def test_expired_metadata_is_refused(world: World) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    month_ago = utc_now() - datetime.timedelta(days=30)
    stale = Publisher(world.repo, world.store, clock=lambda: month_ago)
    stale.publish("mlp", 2, make_model(world.sources / "v2", "mlp", 2, payload(2)))
    with pytest.raises(MetadataError, match="expired"):
        world.client().sync_once()
    _assert_untouched(world)


def test_replayed_older_metadata_is_refused(world: World) -> None:
    world.publish("mlp", 1)
    old_timestamp = world.read_object("metadata/timestamp.json")
    world.sync_and_activate()
    world.publish("mlp", 2)
    world.publish("mlp", 3)
    world.sync_and_activate(("mlp=2",))  # the device has seen the newer metadata
    assert active(world.cache, "mlp") == 2
    world.upload_bytes("metadata/timestamp.json", old_timestamp)
    with pytest.raises(MetadataError, match="BadVersionNumber"):
        world.client().sync_once()
    assert active(world.cache, "mlp") == 2


def test_file_not_listed_in_targets_is_never_fetched(served_v1: World) -> None:
    served_v1.upload_bytes("targets/mlp/3/config.pbtxt", b"unsigned")
    served_v1.upload_bytes("targets/mlp/3/3/model.onnx", b"unsigned")
    report = served_v1.client(("mlp=3",)).sync_once()
    assert report.installed == ()
    assert report.downloaded_bytes == 0
    assert any("not in the signed targets" in r for _m, r in report.errors)
    _assert_untouched(served_v1)


def test_extra_object_in_a_version_folder_is_not_installed(served_v1: World) -> None:
    key = _key_of(served_v1, "mlp/2/2/model.onnx")
    served_v1.upload_bytes(key.rsplit("/", 1)[0] + "/backdoor.so", b"\x7fELF")
    served_v1.sync_and_activate()
    version = served_v1.cache.active_version("mlp")
    assert version is not None
    assert version.version == 2
    assert sorted(p.name for p in (version.path / "2").iterdir()) == ["model.onnx"]


@pytest.mark.parametrize(
    "path", ["mlp/2/2/../../../../etc/cron.d/x", "/etc/passwd", "mlp/2/../3/model.onnx"]
)
def test_unsafe_target_path_is_refused(served_v1: World, tmp_path: Path, path: str) -> None:
    evil = b"* * * * * root sh"
    config = served_v1.local("targets").signed.targets["mlp/2/config.pbtxt"]
    custom = {"model": "mlp", "version": 2, "config_sha256": config.hashes["sha256"]}

    def edit(targets: Targets) -> None:
        info = TargetFile(len(evil), {"sha256": hashlib.sha256(evil).hexdigest()}, path)
        info.unrecognized_fields = {"custom": dict(custom)}
        targets.targets[path] = info

    served_v1.forge_chain(edit)
    with pytest.raises(UnsafeTargetError, match="unsafe target path"):
        served_v1.client().sync_once()
    assert not any(evil in p.read_bytes() for p in files_under(tmp_path) if p.is_file())
    _assert_untouched(served_v1)


class _FullDisk:
    """A part file whose writes fail with ENOSPC after `room` bytes."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, path: Path) -> BinaryIO:
        handle = path.open("ab")
        budget = self

        class Writer:
            def __enter__(self) -> Writer:
                return self

            def __exit__(self, *_exc: object) -> None:
                handle.close()

            def close(self) -> None:
                handle.close()

            def write(self, data: bytes) -> int:
                if len(data) > budget.room:
                    raise OSError(errno.ENOSPC, "No space left on device")
                budget.room -= len(data)
                return handle.write(data)

        writer: Any = Writer()
        return writer  # type: ignore[no-any-return]


def test_disk_full_while_downloading_is_a_clean_error(served_v1: World) -> None:
    downloader = Downloader(served_v1.store, open_part=_FullDisk(1000), sleep=lambda _s: None)
    report = served_v1.client(downloader=downloader).sync_once()
    assert report.activate == ()
    assert any("no space left" in r for _m, r in report.errors), report.errors
    _assert_untouched(served_v1)


def test_cache_budget_full_is_a_clean_error(world: World, tmp_path: Path) -> None:
    world.publish("mlp", 1, size=64 * 1024)
    world.publish("mlp", 2, size=512 * 1024)
    with ModelCache(tmp_path / "small", disk_budget_bytes=300 * 1024) as small:
        world.cache = small
        world.sync_and_activate(("mlp=1",))
        report = world.client().sync_once()
        assert any("disk budget" in r for _m, r in report.errors), report.errors
        assert report.activate == ()
        _assert_untouched(world)
