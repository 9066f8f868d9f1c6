from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import build_test_repository


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo") / "models")
