"""Fixtures of the power-cut tests: a mounted power-cut file system, or a skip that says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.powercut.mount import PowerCutMount, fuse_unavailable


@pytest.fixture(scope="session")
def fuse_ready() -> None:
    """Skip (with the reason printed) where FUSE cannot be had."""
    reason = fuse_unavailable()
    if reason is not None:
        pytest.skip(f"power-cut tests need FUSE: {reason}")


@pytest.fixture
def powercut(fuse_ready: None, tmp_path: Path) -> Iterator[PowerCutMount]:
    """A mounted power-cut file system (unmounted at the end)."""
    with PowerCutMount(tmp_path) as disk:
        yield disk
