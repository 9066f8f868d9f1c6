"""Poll mode: the pure debounce, the folder completeness check, and a real watchdog observer."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from agent.repository.watch import (
    ChangeTracker,
    RepositoryWatcher,
    model_folder_ready,
    model_of_path,
)
from agent.runtime.demo import mlp_model

CONFIG = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
ONNX_BYTES = mlp_model().SerializeToString()


def write_model(model_dir: Path, version: int = 1, data: bytes = ONNX_BYTES, config: str = CONFIG):
    model_dir.mkdir(parents=True, exist_ok=True)
    if config:
        (model_dir / "config.pbtxt").write_text(config)
    (model_dir / str(version)).mkdir(exist_ok=True)
    (model_dir / str(version) / "model.onnx").write_bytes(data)


# ChangeTracker


def test_tracker_waits_for_quiet_after_the_last_event() -> None:
    tracker = ChangeTracker(quiet_s=1.0)
    for now in (0.0, 0.5, 0.9):
        tracker.note("m", now)
    assert tracker.deadline() == pytest.approx(1.9)
    assert tracker.due(1.5) == set()
    assert tracker.due(1.9) == {"m"}
    assert tracker.deadline() is None
    assert tracker.due(10.0) == set()


def test_tracker_models_are_independent() -> None:
    tracker = ChangeTracker(quiet_s=1.0)
    tracker.note("a", 0.0)
    tracker.note("b", 0.5)
    tracker.note("a", 0.8)
    assert tracker.deadline() == pytest.approx(1.5)
    assert tracker.due(1.5) == {"b"}
    assert tracker.deadline() == pytest.approx(1.8)
    assert tracker.due(1.8) == {"a"}
    assert tracker.deadline() is None


def test_tracker_retry_backs_off_and_a_change_resets_it() -> None:
    tracker = ChangeTracker(quiet_s=1.0, max_retry_s=5.0)  # retry_s defaults to 2 x quiet
    tracker.note("m", 0.0)
    assert tracker.due(1.0) == {"m"}
    tracker.retry("m", 1.0)
    assert tracker.deadline() == pytest.approx(3.0)
    assert tracker.due(2.9) == set()
    assert tracker.due(3.0) == {"m"}
    tracker.retry("m", 3.0)
    assert tracker.deadline() == pytest.approx(7.0)  # doubled
    assert tracker.due(7.0) == {"m"}
    tracker.retry("m", 7.0)
    assert tracker.deadline() == pytest.approx(12.0)  # capped at max_retry_s
    tracker.note("m", 8.0)  # the copy moved on: debounce as usual, backoff starts over
    assert tracker.due(9.0) == {"m"}
    tracker.retry("m", 9.0)
    assert tracker.deadline() == pytest.approx(11.0)


def test_tracker_retry_does_not_delay_a_pending_change() -> None:
    tracker = ChangeTracker(quiet_s=1.0, retry_s=10.0)
    tracker.note("m", 0.0)
    tracker.retry("m", 0.5)  # a change arrived while the model was being checked
    assert tracker.deadline() == pytest.approx(1.0)


def test_model_of_path(tmp_path: Path) -> None:
    assert model_of_path(tmp_path, str(tmp_path / "m" / "1" / "model.onnx")) == "m"
    assert model_of_path(tmp_path, os.fsencode(tmp_path / "m")) == "m"
    assert model_of_path(tmp_path, str(tmp_path / "m" / "1" / ".model.onnx.x1")) == "m"
    assert model_of_path(tmp_path, str(tmp_path)) is None
    assert model_of_path(tmp_path, str(tmp_path / ".staging" / "1")) is None
    assert model_of_path(tmp_path / "repo", str(tmp_path / "elsewhere")) is None


# model_folder_ready


def test_complete_folder_is_ready(tmp_path: Path) -> None:
    write_model(tmp_path / "m")
    ready, reason = model_folder_ready(tmp_path / "m")
    assert ready, reason


def test_missing_model_file_is_not_ready(tmp_path: Path) -> None:
    write_model(tmp_path / "m")
    (tmp_path / "m" / "1" / "model.onnx").unlink()
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "model.onnx is missing" in reason


@pytest.mark.parametrize("size", [len(ONNX_BYTES) // 2, 0], ids=["half", "empty"])
def test_truncated_onnx_is_not_ready(tmp_path: Path, size: int) -> None:
    write_model(tmp_path / "m", data=ONNX_BYTES[:size])
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "not a complete ONNX model" in reason


@pytest.mark.parametrize("name", ["1/model.onnx.part", "1/.model.onnx.Xy12", ".config.pbtxt.tmp"])
def test_temporary_file_is_not_ready(tmp_path: Path, name: str) -> None:
    write_model(tmp_path / "m")
    (tmp_path / "m" / name).write_bytes(b"x")
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "temporary file" in reason


def test_bad_config_is_not_ready_with_its_location(tmp_path: Path) -> None:
    write_model(tmp_path / "m", config='name: "m"\nno_such_field: 1\n')
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "config.pbtxt:2:" in reason


def test_specific_policy_ignores_an_unselected_incomplete_version(tmp_path: Path) -> None:
    config = CONFIG + "version_policy: { specific: { versions: [2] } }\n"
    write_model(tmp_path / "m", version=2, config=config)
    (tmp_path / "m" / "1").mkdir()
    (tmp_path / "m" / "1" / "model.onnx.part").write_bytes(ONNX_BYTES[:100])
    ready, reason = model_folder_ready(tmp_path / "m")
    assert ready, reason


def test_latest_policy_waits_for_a_new_version(tmp_path: Path) -> None:
    write_model(tmp_path / "m", version=1)
    (tmp_path / "m" / "2").mkdir()
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "2/model.onnx is missing" in reason


def test_no_version_folder_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    ready, reason = model_folder_ready(tmp_path / "m")
    assert not ready
    assert "no version folder" in reason


def test_model_filename_from_config_or_argument(tmp_path: Path) -> None:
    write_model(tmp_path / "m", config=CONFIG + 'default_model_filename: "net.onnx"\n')
    assert not model_folder_ready(tmp_path / "m")[0]
    (tmp_path / "m" / "1" / "model.onnx").rename(tmp_path / "m" / "1" / "net.onnx")
    assert model_folder_ready(tmp_path / "m")[0]
    (tmp_path / "m" / "config.pbtxt").unlink()
    assert model_folder_ready(tmp_path / "m", "net.onnx")[0]
    assert not model_folder_ready(tmp_path / "m")[0]


# RepositoryWatcher with a real watchdog observer


def test_watcher_acts_once_on_a_folder_copied_in_slowly(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    model_file = repo / "m" / "1" / "model.onnx"
    calls: list[tuple[str, int]] = []
    removed: list[str] = []
    seen = {name: asyncio.Event() for name in ("m", "z", "removed")}

    async def on_ready(model: str) -> None:
        size = model_file.stat().st_size if model == "m" else -1
        calls.append((model, size))
        seen[model].set()
        if model == "z":
            raise RuntimeError("a failing callback must not stop the watcher")

    async def on_removed(model: str) -> None:
        removed.append(model)
        seen["removed"].set()

    async def scenario() -> None:
        watcher = RepositoryWatcher(repo, on_ready, quiet_s=0.2, on_removed=on_removed)
        await watcher.start()
        try:
            # The writer drives a slow copy; the pauses shape the scenario, nothing asserts them.
            (repo / "m").mkdir()
            (repo / "m" / "config.pbtxt").write_text(CONFIG)
            await asyncio.sleep(0.05)
            model_file.parent.mkdir()
            await asyncio.sleep(0.05)
            third = len(ONNX_BYTES) // 3 + 1
            with model_file.open("wb") as out:
                for i, start in enumerate(range(0, len(ONNX_BYTES), third)):
                    out.write(ONNX_BYTES[start : start + third])
                    out.flush()
                    os.fsync(out.fileno())
                    await asyncio.sleep(0.35 if i == 0 else 0.1)  # one stall longer than quiet
            await asyncio.wait_for(seen["m"].wait(), timeout=10)
            # Changes after m was handled: m is not checked again, so z follows m alone.
            write_model(repo / "z", config="")
            await asyncio.wait_for(seen["z"].wait(), timeout=10)
            shutil.rmtree(repo / "m")
            await asyncio.wait_for(seen["removed"].wait(), timeout=10)
        finally:
            await watcher.stop()

    asyncio.run(scenario())
    assert calls == [("m", len(ONNX_BYTES)), ("z", -1)]
    assert removed == ["m"]


def test_watcher_start_fails_on_a_missing_repository(tmp_path: Path) -> None:
    async def on_ready(model: str) -> None:
        raise AssertionError(model)

    async def scenario() -> None:
        watcher = RepositoryWatcher(tmp_path / "missing", on_ready)
        with pytest.raises(OSError):  # noqa: PT011 - the OS picks the subclass
            await watcher.start()
        await watcher.stop()

    asyncio.run(scenario())
