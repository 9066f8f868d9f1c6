"""ModelRegistry on generated ONNX models: which version a request gets, what a failed load leaves
serving, how a swap hands back the replaced model, and what the repository index says."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from agent.errors import (
    AgentError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NoReadyVersionError,
)
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.models.served import ServedModel
from agent.repository.model_config import parse_model_config
from tests.models import VERSIONED_CONFIG, scale_model, write_versions
from tests.support import wait_until

X = np.full((1, 4), 3.0, dtype=np.float32)

# Version 1 of a scale model whose config says INPUT is INT32: the model file disagrees.
MISMATCHED = VERSIONED_CONFIG.replace("TYPE_FP32", "TYPE_INT32", 1)


def answer(served: ServedModel, version: int) -> float:
    """Y[0, 0] of one version for X = 3 (the version's scale factor times 3)."""
    backend = served.versions[version].backend
    assert backend is not None
    return float(backend.run({"X": X}, ["Y"])[0][0, 0])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """m: versions 1 (Y = X) and 2 (Y = 2 X), both served."""
    root = tmp_path / "models"
    write_versions(root, "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    return root


@pytest.fixture
def registry(repo: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    yield reg
    reg.close()


@pytest.fixture
def loaded(registry: ModelRegistry) -> ModelRegistry:
    assert registry.load_all() == {}
    return registry


def add_version(repo: Path, name: str, version: int, payload: bytes | None = None) -> None:
    folder = repo / name / str(version)
    folder.mkdir()
    if payload is None:
        onnx.save(scale_model(float(version)), str(folder / "model.onnx"))
    else:
        (folder / "model.onnx").write_bytes(payload)


def only_version(version: int) -> str:
    return VERSIONED_CONFIG.format(name="m").replace(
        "all: {}", f"specific: {{ versions: [ {version} ] }}"
    )


def test_no_version_resolves_to_the_latest_ready_one(loaded: ModelRegistry) -> None:
    served, version = loaded.resolve("m", None)
    assert version == 2
    assert sorted(served.versions) == [1, 2]
    assert answer(served, version) == 6.0
    assert loaded.resolve("m", "")[1] == 2  # an empty version is no version


def test_an_explicit_version_resolves_to_itself(loaded: ModelRegistry) -> None:
    served, version = loaded.resolve("m", "1")
    assert version == 1
    assert answer(served, version) == 3.0
    assert loaded.resolve("m", "2")[1] == 2
    assert [s.name for s in loaded.served_models()] == ["m"]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", None, "Request for unknown model: 'nope' is not found"),
        ("nope", "1", "Request for unknown model: 'nope' is not found"),
        ("m", "7", "Request for unknown model: 'm' version 7 is not found"),
        ("m", "0", "Request for unknown model: 'm' version 0 is not found"),
    ],
)
def test_unknown_models_and_versions_are_not_found(
    loaded: ModelRegistry, name: str, version: str | None, message: str
) -> None:
    with pytest.raises(ModelNotFoundError) as raised:
        loaded.resolve(name, version)
    assert raised.value.message == message


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (
            "latest",
            "failed to get model version from specified version string 'latest' "
            "(details: stol), version should be an integral value > 0",
        ),
        ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
    ],
)
def test_a_version_that_is_not_a_number_is_an_invalid_argument(
    loaded: ModelRegistry, version: str, message: str
) -> None:
    with pytest.raises(InvalidInputError) as raised:
        loaded.resolve("m", version)
    assert raised.value.message == message


def test_building_a_model_that_is_not_in_the_repository_is_not_found(
    registry: ModelRegistry,
) -> None:
    with pytest.raises(ModelNotFoundError, match="no model directory 'nope' in the repository"):
        registry.build("nope")
    with pytest.raises(ModelNotFoundError):
        registry.load_model("nope")
    assert registry.served_models() == []


def test_a_failed_build_leaves_the_old_model_serving(loaded: ModelRegistry, repo: Path) -> None:
    before, _ = loaded.resolve("m", None)
    add_version(repo, "m", 3, b"not an onnx model")
    build = loaded.build("m", parse_model_config(only_version(3), "override"))
    assert build.served is None
    assert isinstance(build.error, ModelLoadError)
    assert "no version could be loaded (version 3:" in build.reason
    assert loaded.commit(build) is None  # nothing replaced, nothing to release
    served, version = loaded.resolve("m", None)
    assert served is before
    assert (version, answer(served, version)) == (2, 6.0)
    # The failed version joins the index next to the ones still READY.
    rows = {r["version"]: r for r in loaded.index() if r["name"] == "m"}
    assert [rows[v]["state"] for v in ("1", "2", "3")] == ["READY", "READY", "UNAVAILABLE"]
    assert "m/3/model.onnx" in rows["3"]["reason"]
    with pytest.raises(ModelNotReadyError, match="version 3 is not at ready state"):
        loaded.resolve("m", "3")


def test_load_model_raises_for_a_failed_build_and_keeps_the_old_one(
    loaded: ModelRegistry, repo: Path
) -> None:
    before, _ = loaded.resolve("m", None)
    (repo / "m" / "config.pbtxt").write_text(MISMATCHED.format(name="m"))
    with pytest.raises(ModelLoadError, match="no version could be loaded"):
        loaded.load_model("m")
    assert loaded.resolve("m", None)[0] is before
    assert answer(before, 1) == 3.0  # still open: the failed build released nothing


def test_commit_returns_the_replaced_model_and_serves_the_new_one(
    loaded: ModelRegistry, repo: Path
) -> None:
    old, _ = loaded.resolve("m", None)
    add_version(repo, "m", 3)
    build = loaded.build("m")
    assert build.served is not None
    assert build.error is None
    assert loaded.resolve("m", None)[0] is old  # building touches nothing served
    assert loaded.commit(build) is old
    new, version = loaded.resolve("m", None)
    assert new is build.served
    assert (version, answer(new, version)) == (3, 9.0)
    loaded.release(old)  # the caller drains, then releases the replaced model
    assert answer(new, 1) == 3.0  # the new build's own runtimes are untouched
    assert loaded.commit(loaded.build("m")) is new


def test_first_commit_replaces_nothing(registry: ModelRegistry) -> None:
    build = registry.build("m")
    assert registry.commit(build) is None
    assert registry.resolve("m", None)[0] is build.served


def test_unload_then_resolve_is_not_ready(loaded: ModelRegistry) -> None:
    served = loaded.unload("m")
    assert served is not None
    assert sorted(served.versions) == [1, 2]
    loaded.release(served)
    with pytest.raises(ModelNotReadyError, match="'m' has no available versions: unloaded"):
        loaded.resolve("m", None)
    with pytest.raises(ModelNotReadyError, match="'m' version 1 is not at ready state: unloaded"):
        loaded.resolve("m", "1")
    assert loaded.served_models() == []
    assert [(r["version"], r["state"], r["reason"]) for r in loaded.index()] == [
        ("1", "UNAVAILABLE", "unloaded"),
        ("2", "UNAVAILABLE", "unloaded"),
    ]
    assert loaded.unload("m") is None  # already out: nothing to release
    with pytest.raises(ModelNotFoundError):
        loaded.unload("nope")
    loaded.load_model("m")  # and it can come back
    assert loaded.resolve("m", None)[1] == 2


def test_a_reload_keeps_versions_it_no_longer_serves_as_unloaded(
    loaded: ModelRegistry, repo: Path
) -> None:
    (repo / "m" / "config.pbtxt").write_text(only_version(2))
    served = loaded.load_model("m")
    assert sorted(served.versions) == [2]
    with pytest.raises(ModelNotReadyError, match="'m' version 1 is not at ready state: unloaded"):
        loaded.resolve("m", "1")
    assert [(r["version"], r["state"], r["reason"]) for r in loaded.index()] == [
        ("1", "UNAVAILABLE", "unloaded"),
        ("2", "READY", ""),
    ]


def test_a_model_whose_folder_left_is_not_indexed_once_unloaded(
    loaded: ModelRegistry, repo: Path
) -> None:
    served = loaded.unload("m")
    assert served is not None
    loaded.release(served)
    shutil.rmtree(repo / "m")
    assert loaded.index() == []
    with pytest.raises(ModelNotReadyError, match="'m' has no available versions"):
        loaded.resolve("m", None)


def test_mark_failed_takes_a_version_out_then_the_model(loaded: ModelRegistry) -> None:
    served, _ = loaded.resolve("m", None)
    stale = served.versions[2]
    assert loaded.stats.snapshot("m", "2")["model_stats"] != []
    assert loaded.mark_failed("m", 2, "instance died") is True
    assert loaded.resolve("m", None)[1] == 1  # the latest READY one now
    with pytest.raises(ModelNotReadyError, match="version 2 is not at ready state: instance died"):
        loaded.resolve("m", "2")
    assert loaded.mark_failed("m", 2, "again") is False  # already out
    # Its runtime is closed and its statistics dropped off the caller's thread.
    wait_until(lambda: loaded.stats.snapshot("m", "2")["model_stats"] == [], "version 2 retired")

    assert loaded.mark_failed("m", 1, "instance hung", loaded=stale) is False  # not that build
    assert loaded.mark_failed("m", 1, "instance hung") is True
    assert loaded.served_models() == []
    with pytest.raises(ModelNotReadyError, match="'m' has no available versions: instance hung"):
        loaded.resolve("m", None)
    assert [(r["version"], r["state"], r["reason"]) for r in loaded.index()] == [
        ("1", "UNAVAILABLE", "instance hung"),
        ("2", "UNAVAILABLE", "instance died"),
    ]
    assert loaded.mark_failed("nope", 1, "x") is False


def test_index_rows_for_every_kind_of_model(repo: Path) -> None:
    write_versions(repo, "broken", {1: scale_model(1.0)})
    (repo / "broken" / "config.pbtxt").write_text(MISMATCHED.format(name="broken"))
    write_versions(repo, "garbled", {1: scale_model(1.0)})
    (repo / "garbled" / "config.pbtxt").write_text("this is { not a config")
    write_versions(repo, "idle", {1: scale_model(1.0)})
    registry = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    try:
        for name in ("m", "broken", "garbled"):
            with contextlib.suppress(AgentError):  # the index says why
                registry.load_model(name)
        rows = registry.index()
    finally:
        registry.close()
    by_name: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    assert sorted(by_name) == ["broken", "garbled", "idle", "m"]  # sorted, every directory
    assert by_name["idle"] == [{"name": "idle"}]  # never loaded: no state yet
    assert by_name["m"] == [
        {"name": "m", "version": "1", "state": "READY", "reason": ""},
        {"name": "m", "version": "2", "state": "READY", "reason": ""},
    ]
    [broken] = by_name["broken"]  # the version was tried: it says why it failed
    assert (broken["version"], broken["state"]) == ("1", "UNAVAILABLE")
    assert broken["reason"].startswith("Invalid argument: ")  # Triton's status code first
    assert "configuration expects datatype TYPE_INT32" in broken["reason"]
    assert "model provides TYPE_FP32" in broken["reason"]
    [garbled] = by_name["garbled"]  # the config did not parse: no version was tried
    assert "version" not in garbled
    assert garbled["state"] == "UNAVAILABLE"
    assert "garbled/config.pbtxt" in garbled["reason"]
    assert "no field named" in garbled["reason"]


def test_load_all_reports_each_failure_and_serves_the_rest(repo: Path) -> None:
    write_versions(repo, "broken", {1: scale_model(1.0)})
    (repo / "broken" / "config.pbtxt").write_text(MISMATCHED.format(name="broken"))
    registry = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    try:
        failures = registry.load_all()
        assert list(failures) == ["broken"]
        assert "no version could be loaded" in failures["broken"]
        assert [s.name for s in registry.served_models()] == ["m"]
        with pytest.raises(ModelNotReadyError):
            registry.resolve("broken", None)
    finally:
        registry.close()


def test_a_model_whose_config_failed_is_not_found_with_its_reason(repo: Path) -> None:
    """Triton knows no model whose config failed before a version was read: 'is not found',
    the agent's reason after it; a failed version's model 'has no available versions'."""
    write_versions(repo, "misnamed", {1: scale_model(1.0)})
    (repo / "misnamed" / "config.pbtxt").write_text('name: "other"')
    write_versions(repo, "flat", {1: scale_model(1.0)})
    (repo / "flat" / "config.pbtxt").write_text(
        VERSIONED_CONFIG.format(name="flat").replace("dims: [ 1, 4 ]", "dims: [ 1, 0 ]", 1)
    )
    registry = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    try:
        for name in ("misnamed", "flat"):
            with contextlib.suppress(AgentError):
                registry.load_model(name)
        with pytest.raises(NoReadyVersionError) as misnamed:
            registry.resolve("misnamed", None)
        with pytest.raises(NoReadyVersionError) as flat:
            registry.resolve("flat", None)
        rows = {r["name"]: r for r in registry.index()}
    finally:
        registry.close()
    assert misnamed.value.message == (
        "Request for unknown model: 'misnamed' is not found: "
        "config name 'other' does not match the model directory 'misnamed'"
    )
    assert "version" not in rows["misnamed"]  # refused with the config: no version was read
    # A dimension below 1 fails the version (as Triton checks it), in Triton's words.
    assert flat.value.message.startswith("Request for unknown model: 'flat' has no available")
    assert rows["flat"]["version"] == "1"
    assert rows["flat"]["reason"] == (
        "Invalid argument: model input 'X' dimension must be integer >= 1, or -1 to indicate "
        "a variable-size dimension for flat"
    )
