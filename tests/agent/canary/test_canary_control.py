"""The canary manager on a real registry, without sockets: pins, persistence, versions, events."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from agent.canary.control import CanaryManager
from agent.canary.policy import CanaryPolicy
from agent.errors import (
    BackendError,
    ConflictError,
    InvalidInputError,
    ModelNotFoundError,
    RequestTimeoutError,
)
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from tests.models import scale_model, write_versions
from tests.support import RecordingEvents as Events
from tests.support import promote


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_versions(root, "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    return root


@pytest.fixture
def registry(repo: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    assert reg.load_all() == {}
    yield reg
    reg.close()


def test_pin_survives_a_restart_with_a_state_file(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    events = Events()
    first = CanaryManager(registry, events, state_path=state)
    assert first.route("m") is None  # no canary: the registry's default (latest)
    promote(first)
    assert events.kinds() == ["canary_started", "canary_promoted"]
    assert events.seen[1][3]["good_requests"] == 5
    assert first.route("m") == 2
    assert json.loads(state.read_text())["models"]["m"]["pin"] == 2
    again = CanaryManager(registry, Events(), state_path=state)
    assert again.persistent
    assert again.route("m") == 2
    assert again.status("m")["pinned_version"] == 2


def test_running_canary_resumes_with_fresh_counts(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    first = CanaryManager(registry, Events(), state_path=state)
    first.start("m", CanaryPolicy(candidate=1, share=0.3, promote_after=100, window=10))
    first.record("m", 1, 50, BackendError("boom"))
    assert first.status("m")["window"][0]["errors"] == 1
    resumed = CanaryManager(registry, Events(), rng=random.Random(7), state_path=state)
    status = resumed.status("m")
    assert (status["state"], status["candidate"], status["baseline"]) == ("RUNNING", 1, 2)
    assert status["window"][0]["requests"] == 0
    assert {resumed.route("m") for _ in range(100)} == {1, 2}


def test_without_a_state_file_nothing_survives(registry: ModelRegistry, tmp_path: Path) -> None:
    first = CanaryManager(registry, Events())
    assert not first.persistent
    promote(first)
    assert list(tmp_path.glob("*.json")) == []
    assert CanaryManager(registry, Events()).route("m") is None


def test_pin_dropped_when_the_model_serves_other_versions(
    registry: ModelRegistry, repo: Path
) -> None:
    events = Events()
    manager = CanaryManager(registry, events)
    promote(manager)
    assert manager.route("m") == 2
    shutil.rmtree(repo / "m" / "2")
    registry.load_model("m")  # now serves version 1 only
    assert manager.route("m") is None
    model, version, kind, detail = events.seen[-1]
    assert (model, version, kind) == ("m", 2, "canary_stopped")
    assert detail["reason"] == "pin dropped: model now serves versions [1], not [1, 2]"
    assert manager.status("m")["pinned_version"] is None


def test_running_canary_stopped_when_versions_change(registry: ModelRegistry, repo: Path) -> None:
    events = Events()
    manager = CanaryManager(registry, events)
    manager.start("m", CanaryPolicy(candidate=2, share=0.5))
    (repo / "m" / "3").mkdir()
    onnx.save(scale_model(3.0), str(repo / "m" / "3" / "model.onnx"))
    registry.load_model("m")  # now serves 1, 2, 3
    assert manager.route("m") is None
    assert events.kinds() == ["canary_started", "canary_stopped"]
    assert "model now serves versions [1, 2, 3]" in str(events.seen[-1][3]["reason"])


def test_only_version_failures_count(registry: ModelRegistry) -> None:
    manager = CanaryManager(registry, Events())
    manager.start("m", CanaryPolicy(candidate=2, share=0.5, window=10))
    manager.record("m", 2, 10, InvalidInputError("bad shape"))  # the client's fault: ignored
    manager.record("m", 2, 10, RequestTimeoutError("expired"))
    manager.record("m", 2, 10, None)
    manager.record("m", 1, 10, None)
    candidate, baseline = manager.status("m")["window"]
    assert (candidate["requests"], candidate["errors"]) == (2, 1)
    assert (baseline["requests"], baseline["errors"]) == (1, 0)


def test_start_checks(registry: ModelRegistry) -> None:
    manager = CanaryManager(registry, Events())
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        manager.start("nope", CanaryPolicy(candidate=2, share=0.5))
    with pytest.raises(ModelNotFoundError, match="not READY"):
        manager.start("m", CanaryPolicy(candidate=5, share=0.5))
    manager.start("m", CanaryPolicy(candidate=2, share=0.5))
    with pytest.raises(ConflictError, match="already runs"):
        manager.start("m", CanaryPolicy(candidate=1, share=0.5))
    assert manager.shares() == [("m", 2, 0.5), ("m", 1, 0.5)]


def test_configured_canary_skipped_once_decided(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    first = CanaryManager(registry, Events(), state_path=state)
    promote(first)
    events = Events()
    restarted = CanaryManager(registry, events, state_path=state)
    restarted.startup([("m", CanaryPolicy(candidate=2, share=0.5))])
    assert events.seen == []  # pinned to 2 for these versions: not started again
    refused = Events()
    fresh = CanaryManager(registry, refused)
    fresh.startup([("m", CanaryPolicy(candidate=4, share=0.5))])
    [(model, version, kind, detail)] = refused.seen
    assert (model, version, kind) == ("m", 4, "canary_refused")
    assert "version 4 of model 'm' is not READY" in str(detail["reason"])


def test_corrupt_state_file_is_ignored(registry: ModelRegistry, tmp_path: Path) -> None:
    state = tmp_path / "canary.json"
    state.write_text("{not json")
    manager = CanaryManager(registry, Events(), state_path=state)
    assert manager.route("m") is None
    promote(manager)  # and is replaced by a valid one
    assert json.loads(state.read_text())["schema"] == 1
