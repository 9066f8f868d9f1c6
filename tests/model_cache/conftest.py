from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from model_cache import ModelCache
from tests.fakes import FakeClock
from tests.model_cache.support import MakeSource, OpenCache, make_source


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def open_cache(cache_root: Path, clock: FakeClock) -> Iterator[OpenCache]:
    """Open a ModelCache on the test's root (again and again: each open is a restart)."""
    opened: list[ModelCache] = []

    def factory(**kwargs: Any) -> ModelCache:
        cache = ModelCache(cache_root, clock=clock, **kwargs)
        opened.append(cache)
        return cache

    yield factory
    for cache in opened:
        cache.close()


@pytest.fixture
def cache(open_cache: OpenCache) -> ModelCache:
    return open_cache()


@pytest.fixture
def src(tmp_path: Path) -> MakeSource:
    def factory(version: int, files: Mapping[str, bytes] | None = None, **kwargs: Any) -> Path:
        return make_source(tmp_path, version, files, **kwargs)

    return factory
