"""Pure path rules: names, shards, version folders, view generations, symlink targets."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from model_cache import CacheLayout, InvalidVersionError
from model_cache.layout import (
    parse_version_dirname,
    parse_view_name,
    validate_digest,
    validate_model_name,
    validate_relpath,
    validate_version,
    version_dirname,
    view_name,
)

DIGEST = hashlib.sha256(b"x").hexdigest()


def test_paths_under_root() -> None:
    layout = CacheLayout(Path("/c"))

    assert layout.state_db == Path("/c/state.db")
    assert layout.lock_file == Path("/c/lock")
    assert layout.blobs_dir == Path("/c/blobs/sha256")
    assert layout.blob_tmp_dir == Path("/c/blobs/.tmp")
    assert layout.staging_dir == Path("/c/staging")
    assert layout.versions_dir == Path("/c/versions")
    assert layout.views_dir == Path("/c/views")
    assert layout.repository == Path("/c/repository")


def test_blob_path_is_sharded_by_first_two_hex_digits() -> None:
    path = CacheLayout(Path("/c")).blob_path(DIGEST)

    assert path == Path("/c/blobs/sha256") / DIGEST[:2] / DIGEST


def test_version_dir_names_version_and_digest_prefix() -> None:
    path = CacheLayout(Path("/c")).version_dir("resnet", 3, DIGEST)

    assert path == Path(f"/c/versions/resnet/3-{DIGEST[:12]}")


def test_version_dirname_round_trip() -> None:
    name = version_dirname(42, DIGEST)

    assert name == f"42-{DIGEST[:12]}"
    assert parse_version_dirname(name) == (42, DIGEST[:12])


@pytest.mark.parametrize(
    "name", ["42", "0-abcdefabcdef", "1-ABCDEFABCDEF", "1-abc", ".tmp-1-abcdefabcdef", "x-1"]
)
def test_parse_version_dirname_rejects_other_names(name: str) -> None:
    assert parse_version_dirname(name) is None


def test_view_name_round_trip_and_ordering() -> None:
    assert view_name(7) == "v00000007"
    assert parse_view_name(view_name(7)) == 7
    assert parse_view_name("v1") is None
    assert parse_view_name("current") is None
    assert sorted([view_name(10), view_name(9)]) == [view_name(9), view_name(10)]


def test_view_targets_resolve_to_the_version_folder(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    config_target, version_target = layout.view_targets("m", 2, DIGEST)
    model_dir = layout.view_dir(view_name(1)) / "m"
    unit = layout.version_dir("m", 2, DIGEST)

    assert not os.path.isabs(config_target)
    assert not os.path.isabs(version_target)
    assert os.path.normpath(model_dir / config_target) == str(unit / "config.pbtxt")
    assert os.path.normpath(model_dir / version_target) == str(unit / "2")
    assert layout.repository_target(view_name(1)) == "views/v00000001"


@pytest.mark.parametrize("name", ["resnet50", "a", "A.b-c_d", "9lives", "x" * 128])
def test_valid_model_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "-x", ".hidden", "a b", "x" * 129, "é", "a\x00"]
)
def test_invalid_model_names(name: str) -> None:
    with pytest.raises(InvalidVersionError):
        validate_model_name(name)


@pytest.mark.parametrize("version", [0, -1, 10**18, True])
def test_invalid_versions(version: int) -> None:
    with pytest.raises(InvalidVersionError):
        validate_version(version)


def test_valid_version() -> None:
    assert validate_version(1) == 1


@pytest.mark.parametrize("digest", ["", "abc", DIGEST.upper(), DIGEST + "0", "g" * 64])
def test_invalid_digests(digest: str) -> None:
    with pytest.raises(InvalidVersionError):
        validate_digest(digest)


@pytest.mark.parametrize("path", ["config.pbtxt", "1/model.onnx", "1/a/b/c.bin", "1/.keep"])
def test_valid_relpaths(path: str) -> None:
    assert validate_relpath(path) == path


@pytest.mark.parametrize(
    "path",
    ["", "/abs", "../x", "1/../../x", "a//b", "a/./b", "a/", "a\\b", "a\x00b", "1/.tmp-x"],
)
def test_invalid_relpaths(path: str) -> None:
    with pytest.raises(InvalidVersionError):
        validate_relpath(path)


def test_invalid_names_never_become_paths() -> None:
    layout = CacheLayout(Path("/c"))

    with pytest.raises(InvalidVersionError):
        layout.version_dir("../etc", 1, DIGEST)
    with pytest.raises(InvalidVersionError):
        layout.blob_path("../../etc/passwd")
    with pytest.raises(InvalidVersionError):
        layout.view_dir("../versions")
