"""Helpers shared by the model cache tests: source folders, served-view reads (the fake clock is
tests.fakes.FakeClock)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.repository.layout import list_models, list_versions
from model_cache import FaultHook, ModelCache

#: Opens a ModelCache on the test's root; each call is a restart.
OpenCache = Callable[..., ModelCache]
#: Makes a fresh source model folder: (version, files, *, model=, config=) -> Path.
MakeSource = Callable[..., Path]

CONFIG = 'name: "{model}"\nplatform: "onnxruntime_onnx"\n'


_counter = itertools.count()


def make_source(
    base: Path,
    version: int,
    files: Mapping[str, bytes] | None = None,
    *,
    model: str = "m",
    config: str | None = None,
) -> Path:
    """A fresh Triton model folder holding `config.pbtxt` and `VERSION/` with `files`."""
    model_dir = base / "src" / f"{model}-{version}-{next(_counter)}"
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True)
    text = CONFIG.format(model=model) if config is None else config
    (model_dir / "config.pbtxt").write_text(text, encoding="utf-8")
    content = files if files is not None else {"model.onnx": f"{model} v{version}".encode()}
    for rel, data in content.items():
        path = version_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return model_dir


def served(cache: ModelCache) -> dict[str, dict[int, bytes]]:
    """What the served repository holds, read the way the agent reads it.

    Returns:
        model → {version: bytes of VERSION/model.onnx}, every file read through the symlinks.
    """
    repo = cache.repository_path
    result: dict[str, dict[int, bytes]] = {}
    for model in list_models(repo):
        model_dir = repo / model
        assert (model_dir / "config.pbtxt").is_file()
        result[model] = {
            v: (model_dir / str(v) / "model.onnx").read_bytes() for v in list_versions(model_dir)
        }
    return result


def tree(root: Path) -> list[str]:
    """Every path under `root`, relative, sorted (for "nothing half-written remains")."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def tamper(path: Path, data: bytes) -> None:
    """Overwrite a read-only file in place (same inode), as an attacker or bit rot would."""
    os.chmod(path, 0o644)
    with path.open("r+b") as handle:
        handle.write(data)
        handle.truncate()


class Crash(Exception):
    """Raised by a fault hook to stop an operation dead at one step."""


def crash_at(step: str) -> FaultHook:
    def hook(name: str) -> None:
        if name == step:
            raise Crash(name)

    return hook


def ready_and_active(cache: ModelCache, src: MakeSource) -> None:
    """m v1 active, m v2 ready."""
    cache.install("m", 1, src(1))
    cache.activate("m", 1)
    cache.install("m", 2, src(2))


def assert_clean(cache: ModelCache) -> None:
    """Nothing half-written remains, and the served view is exactly what the database says."""
    layout = cache.layout
    assert list(layout.staging_dir.iterdir()) == []
    assert list(layout.blob_tmp_dir.iterdir()) == []
    assert len(list(layout.views_dir.iterdir())) == 1
    assert not [p for p in layout.root.iterdir() if p.name.startswith(".tmp-")]
    active = {m: {v.version} for m, v in cache.served().items()}
    assert {m: set(vs) for m, vs in served(cache).items()} == active
    for model in cache.models():
        folders = {p.name for p in layout.model_dir(model).iterdir()}
        rows = {v.path.name for v in cache.list_versions(model)}
        assert folders <= rows
