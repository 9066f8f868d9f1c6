"""The publisher: layout on the store, immutability, re-signing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sync.errors import PublishError
from sync.publish import target_key
from tests.sync.support import World, make_model, payload


def test_publish_uploads_targets_then_metadata(folder_world: World) -> None:
    folder_world.publish("mlp", 1)
    targets = folder_world.local("targets").signed
    assert sorted(targets.targets) == ["mlp/1/1/model.onnx", "mlp/1/config.pbtxt"]
    info = targets.targets["mlp/1/1/model.onnx"]
    assert info.custom["model"] == "mlp"
    assert info.custom["version"] == 1
    assert folder_world.read_object(target_key(info)) == payload(1)
    for key in ("1.root.json", "1.targets.json", "1.snapshot.json", "timestamp.json"):
        assert folder_world.read_object(f"metadata/{key}")


def test_same_version_same_content_is_unchanged(folder_world: World) -> None:
    folder = make_model(folder_world.sources, "mlp", 1, payload(1))
    first = folder_world.publisher.publish("mlp", 1, folder)
    again = folder_world.publisher.publish("mlp", 1, folder)
    assert again.unchanged
    assert again.targets_version == first.targets_version


def test_version_numbers_are_immutable(folder_world: World) -> None:
    folder_world.publish("mlp", 1)
    other = make_model(folder_world.sources / "x", "mlp", 1, b"other bytes")
    with pytest.raises(PublishError, match="immutable"):
        folder_world.publisher.publish("mlp", 1, other)


def test_bad_sources_are_refused(folder_world: World, tmp_path: Path) -> None:
    with pytest.raises(PublishError, match=r"missing config\.pbtxt"):
        folder_world.publisher.publish("mlp", 1, tmp_path / "nothing")
    folder = make_model(tmp_path / "e", "mlp", 1, b"w")
    (folder / "1" / "empty").mkdir()
    with pytest.raises(PublishError, match="empty directories"):
        folder_world.publisher.publish("mlp", 1, folder)


def test_resign_bumps_every_role(folder_world: World) -> None:
    folder_world.publish("mlp", 1)
    report = folder_world.publisher.resign()
    assert (report.targets_version, report.snapshot_version, report.timestamp_version) == (2, 2, 2)
    folder_world.sync_and_activate()


def test_folder_store_end_to_end(folder_world: World) -> None:
    folder_world.publish("mlp", 1)
    folder_world.sync_and_activate()
    found = folder_world.cache.active_version("mlp")
    assert found is not None
    assert found.version == 1
