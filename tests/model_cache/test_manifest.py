"""Manifests (canonical, validated) and the rules a source folder must meet."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from model_cache import InvalidVersionError
from model_cache.manifest import Manifest, ManifestEntry, scan_source
from tests.model_cache.support import make_source

D = hashlib.sha256(b"content").hexdigest()


def manifest() -> Manifest:
    return Manifest.build(
        "m",
        1,
        ["1/sub", "1"],
        [ManifestEntry("1/sub/b.bin", D, 3), ManifestEntry("config.pbtxt", D, 7)],
    )


def body(**changes: object) -> bytes:
    data = json.loads(manifest().to_bytes())
    data.update(changes)
    return json.dumps(data).encode()


def test_build_sorts_so_equal_content_gives_equal_manifests() -> None:
    shuffled = Manifest.build(
        "m",
        1,
        ["1", "1/sub"],
        [ManifestEntry("config.pbtxt", D, 7), ManifestEntry("1/sub/b.bin", D, 3)],
    )

    assert shuffled == manifest()
    assert shuffled.to_bytes() == manifest().to_bytes()
    assert shuffled.digest == manifest().digest


def test_to_bytes_is_canonical_json() -> None:
    data = manifest().to_bytes()

    assert b" " not in data
    assert json.loads(data)["files"]["config.pbtxt"] == {"digest": D, "size": 7}
    assert manifest().digest == hashlib.sha256(data).hexdigest()
    assert manifest().total_bytes == 10


def test_round_trip() -> None:
    assert Manifest.from_bytes(manifest().to_bytes()) == manifest()


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        body(format=2),
        body(model="../x"),
        body(version=0),
        body(dirs=["../1"]),
        body(files={"../evil": {"digest": D, "size": 1}}),
        body(files={"2/model.onnx": {"digest": D, "size": 1}}),
        body(files={"1/model.onnx": {"digest": "nope", "size": 1}}),
        body(files={"1/model.onnx": {"digest": D, "size": -1}}),
        body(files={"1/model.onnx": {"digest": D, "size": True}}),
        body(files={"1/model.onnx": {"digest": D}}),
        b" " * (4 * 1024 * 1024 + 1),
    ],
)
def test_from_bytes_rejects_malformed_manifests(data: bytes) -> None:
    with pytest.raises(InvalidVersionError):
        Manifest.from_bytes(data)


def test_scan_source_lists_config_and_version_files(tmp_path: Path) -> None:
    source = make_source(tmp_path, 3, {"model.onnx": b"abc", "a/b/c.txt": b"x"})

    tree = scan_source(source, 3)

    assert [f.path for f in tree.files] == ["config.pbtxt", "3/a/b/c.txt", "3/model.onnx"]
    assert tree.dirs == ("3", "3/a", "3/a/b")
    assert tree.total_bytes == (source / "config.pbtxt").stat().st_size + 4


def test_scan_source_keeps_empty_directories(tmp_path: Path) -> None:
    source = make_source(tmp_path, 1)
    (source / "1" / "model.savedmodel" / "variables").mkdir(parents=True)

    assert "1/model.savedmodel/variables" in scan_source(source, 1).dirs


def test_scan_source_refuses_special_files(tmp_path: Path) -> None:
    source = make_source(tmp_path, 1)
    os.mkfifo(source / "1" / "pipe")

    with pytest.raises(InvalidVersionError, match="not a regular file"):
        scan_source(source, 1)


def test_scan_source_refuses_a_config_symlink(tmp_path: Path) -> None:
    source = make_source(tmp_path, 1)
    (source / "config.pbtxt").unlink()
    (source / "config.pbtxt").symlink_to(tmp_path / "elsewhere.pbtxt")

    with pytest.raises(InvalidVersionError, match=r"config\.pbtxt"):
        scan_source(source, 1)


def test_scan_source_refuses_a_symlinked_version_folder(tmp_path: Path) -> None:
    real = make_source(tmp_path, 1)
    source = make_source(tmp_path, 2)
    (source / "1").symlink_to(real / "1")

    with pytest.raises(InvalidVersionError, match="version folder"):
        scan_source(source, 1)


@pytest.mark.parametrize(
    "files", [{"model.plan": b"x"}, {"model.py": b"x"}, {"model.savedmodel/saved_model.pb": b"x"}]
)
def test_any_model_file_satisfies_a_config_without_default_filename(
    tmp_path: Path, files: dict[str, bytes]
) -> None:
    source = make_source(tmp_path, 1, files, config='name: "m"\nbackend: "x"\n')

    assert scan_source(source, 1).files
