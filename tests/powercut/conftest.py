"""Fixtures of the power-cut tests: a mounted power-cut file system, or a skip that says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.powercut.mount import PowerCutMount, fuse_unavailable


@pytest.fixture(scope="session")
def fuse_ready(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip (with the reason printed) where FUSE cannot be had: missing pieces, or a mount
    refused (a container without the right to mount)."""
    reason = fuse_unavailable()
    if reason is None:
        try:
            with PowerCutMount(tmp_path_factory.mktemp("fuse-probe")):
                pass
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0]
    if reason is not None:
        pytest.skip(f"power-cut tests need FUSE: {reason}")


@pytest.fixture
def powercut(fuse_ready: None, tmp_path: Path) -> Iterator[PowerCutMount]:
    """A mounted power-cut file system (unmounted at the end)."""
    with PowerCutMount(tmp_path) as disk:
        yield disk
