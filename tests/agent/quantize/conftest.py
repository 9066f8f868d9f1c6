from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.agent.quantize.digits import Digits, train_digits, write_calibration, write_eval


@pytest.fixture(scope="session")
def digits() -> Digits:
    return train_digits()


@pytest.fixture(scope="session")
def digits_files(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model.onnx, calib/, eval.npz (labelled) and reference.npz (no labels)."""
    root = tmp_path_factory.mktemp("digits")
    onnx.save(digits.model, str(root / "model.onnx"))
    write_calibration(root / "calib", digits.x_train)
    write_eval(root / "eval.npz", digits)
    write_eval(root / "reference.npz", digits, labels=False)
    return root
