"""The INT8 digits model served over KServe v2 by the real agent stays inside the budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.quantize.command import main
from tests.agent.quantize.digits import DIGITS_CONFIG, Digits
from tests.server import running_agent

BUDGET = 2.0


def test_int8_model_served_over_kserve_stays_in_budget(
    digits: Digits, digits_files: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    version = repo / "digits_int8" / "1"
    rc = main(
        [
            "quantize",
            str(digits_files / "model.onnx"),
            "--calibration",
            str(digits_files / "calib"),
            "--output",
            str(version / "model.onnx"),
            "--report",
            str(tmp_path / "report.json"),
            "--eval",
            str(digits_files / "eval.npz"),
            "--budget",
            str(BUDGET),
        ]
    )
    assert rc == 0
    (repo / "digits_int8" / "config.pbtxt").write_text(DIGITS_CONFIG.format(name="digits_int8"))
    fp32 = ort.InferenceSession(
        str(digits_files / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    x, y = digits.x_test, digits.y_test
    reference = fp32.run(["OUTPUT0"], {"INPUT0": x})[0]

    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    served = []
    with running_agent(config) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        assert client.is_model_ready("digits_int8")
        for start in range(0, len(x), 16):
            batch = x[start : start + 16]
            tensor = httpclient.InferInput("INPUT0", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch, binary_data=True)
            result = client.infer("digits_int8", [tensor])
            served.append(result.as_numpy("OUTPUT0"))
        client.close()
    int8 = np.concatenate(served)
    assert int8.shape == reference.shape
    fp32_acc = 100 * np.mean(reference.argmax(1) == y)
    int8_acc = 100 * np.mean(int8.argmax(1) == y)
    agreement = 100 * np.mean(reference.argmax(1) == int8.argmax(1))
    assert fp32_acc - int8_acc <= BUDGET
    assert 100 - agreement <= BUDGET
    assert float(np.abs(int8 - reference).mean()) < 0.02
    np.testing.assert_allclose(int8.sum(axis=1), 1.0, atol=0.05)  # a softmax, 8-bit steps
