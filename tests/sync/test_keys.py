"""Key files, thresholds and root/targets key rotation as TUF defines them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, Root

from model_cache import ModelCache
from sync.errors import KeyFileError, MetadataError, PublishError
from sync.keys import RoleSpec, init_keys, keys_dir, load_signers, read_root, rotate_keys
from sync.s3 import S3Store
from tests.sync.support import World, active


def test_key_files_are_private(tmp_path: Path) -> None:
    md = init_keys(tmp_path / "r", {"targets": RoleSpec(2, 2)})
    files = sorted(keys_dir(tmp_path / "r").glob("*.pem"))
    assert len(files) == 5
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(keys_dir(tmp_path / "r").stat().st_mode) == 0o700
    assert md.signed.roles["targets"].threshold == 2
    assert b"PRIVATE KEY" not in (tmp_path / "r" / "metadata" / "root.json").read_bytes()


def test_readable_key_file_is_refused(tmp_path: Path) -> None:
    init_keys(tmp_path / "r", {})
    path = next(keys_dir(tmp_path / "r").glob("targets-*.pem"))
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="accessible by others"):
        load_signers(tmp_path / "r")


def test_init_twice_is_refused(tmp_path: Path) -> None:
    init_keys(tmp_path / "r", {})
    with pytest.raises(PublishError, match="already has a root"):
        init_keys(tmp_path / "r", {})


def test_threshold_above_key_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="threshold 3"):
        init_keys(tmp_path / "r", {"root": RoleSpec(2, 3)})


@pytest.fixture
def two_of_two(tmp_path: Path, s3_store: S3Store, cache: ModelCache) -> World:
    init_keys(tmp_path / "r2", {"targets": RoleSpec(2, 2), "root": RoleSpec(2, 2)})
    return World(tmp_path / "r2", s3_store, cache, tmp_path / "work", tmp_path / "src")


def test_threshold_of_two_signatures(two_of_two: World) -> None:
    two_of_two.publish("mlp", 1)
    targets = two_of_two.local("targets")
    assert len(targets.signatures) == 2
    two_of_two.sync_and_activate()
    assert active(two_of_two.cache, "mlp") == 1


def test_publisher_refuses_to_sign_below_threshold(two_of_two: World) -> None:
    away = next(keys_dir(two_of_two.repo).glob("targets-*.pem"))
    away.rename(two_of_two.repo / "elsewhere.pem")
    with pytest.raises(PublishError, match="only 1 of the 2 targets keys"):
        two_of_two.publish("mlp", 1)


def test_device_refuses_metadata_below_threshold(two_of_two: World) -> None:
    two_of_two.publish("mlp", 1)
    two_of_two.sync_and_activate()
    root = read_root(two_of_two.repo).signed
    signers = load_signers(two_of_two.repo)
    one = [signers[root.roles["targets"].keyids[0]]]
    two_of_two.forge_chain(targets_signers=one)
    with pytest.raises(MetadataError, match="targets"):
        two_of_two.client().sync_once()
    assert active(two_of_two.cache, "mlp") == 1


def test_root_key_rotation_is_followed_by_devices(world: World) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    old = read_root(world.repo).signed.roles["root"].keyids
    new_root = rotate_keys(world.repo, "root", add=1, remove=tuple(old))
    assert new_root.signed.version == 2
    assert len(new_root.signatures) == 2  # old key and new key
    assert not set(old) & set(new_root.signed.roles["root"].keyids)
    assert list((keys_dir(world.repo) / "retired").glob("root-*.pem"))
    world.publish("mlp", 2)
    world.sync_and_activate()  # the device still starts from root v1
    assert active(world.cache, "mlp") == 2
    assert (world.work / "metadata" / "root_history" / "2.root.json").is_file()


def test_root_signed_only_by_new_keys_is_refused(world: World) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    old = read_root(world.repo).signed.roles["root"].keyids
    rotated = rotate_keys(world.repo, "root", add=1, remove=tuple(old))
    forged = Metadata[Root].from_bytes(rotated.to_bytes())
    new_id = forged.signed.roles["root"].keyids[0]
    forged.signatures.clear()
    forged.sign(load_signers(world.repo)[new_id])  # the old root never agreed
    world.upload_bytes("metadata/2.root.json", forged.to_bytes())
    with pytest.raises(MetadataError, match="root"):
        world.client().sync_once()
    assert active(world.cache, "mlp") == 1


def test_targets_key_rotation_revokes_the_old_key(world: World) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    old_id = read_root(world.repo).signed.roles["targets"].keyids[0]
    old_signer = load_signers(world.repo)[old_id]
    rotate_keys(world.repo, "targets", add=1, remove=(old_id[:12],))
    world.publisher.resign()
    world.publish("mlp", 2)
    world.sync_and_activate()
    assert active(world.cache, "mlp") == 2
    world.forge_chain(targets_signers=[old_signer])  # a thief with the retired key
    with pytest.raises(MetadataError, match="targets"):
        world.client().sync_once()
    assert active(world.cache, "mlp") == 2
