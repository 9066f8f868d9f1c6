"""A small digits classifier trained by the tests (scikit-learn's bundled data, no download).

An MLP 64 → 32 → 10 trained with scikit-learn, written as an ONNX graph by hand
(Mul → Gemm → Relu → Gemm → Softmax), so no converter package is needed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

from tests.models import save_ready

DIGITS_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
"""


@dataclass(frozen=True)
class Digits:
    model: onnx.ModelProto
    x_train: np.ndarray  # float32 [n, 64], raw pixel values 0..16
    x_test: np.ndarray
    y_test: np.ndarray


def train_digits(seed: int = 0) -> Digits:
    data = load_digits()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = 1200
    clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=200, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x[:split] / 16.0, y[:split])
    w1, w2 = (np.asarray(c, dtype=np.float32) for c in clf.coefs_)
    b1, b2 = (np.asarray(b, dtype=np.float32) for b in clf.intercepts_)
    inits = [
        numpy_helper.from_array(np.array(1.0 / 16.0, dtype=np.float32), "scale"),
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(b1, "B1"),
        numpy_helper.from_array(w2, "W2"),
        numpy_helper.from_array(b2, "B2"),
    ]
    nodes = [
        helper.make_node("Mul", ["INPUT0", "scale"], ["x"]),
        helper.make_node("Gemm", ["x", "W1", "B1"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "W2", "B2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["OUTPUT0"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return Digits(save_ready(graph), x[:split], x[split:], y[split:])


def write_calibration(folder: Path, x: np.ndarray, *, files: int = 8, scale: float = 1.0) -> Path:
    """Calibration samples: `files` batches of 16 (the first as single samples, without batch)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "000-single.npy", (x[0] * scale).astype(np.float32))
    for i in range(files):
        batch = x[1 + 16 * i : 1 + 16 * (i + 1)] * scale
        np.save(folder / f"{i + 1:03d}.npy", batch.astype(np.float32))
    return folder


def write_eval(path: Path, digits: Digits, *, labels: bool = True) -> Path:
    if labels:
        np.savez(path, INPUT0=digits.x_test, labels=digits.y_test)
    else:
        np.savez(path, INPUT0=digits.x_test)
    return path
