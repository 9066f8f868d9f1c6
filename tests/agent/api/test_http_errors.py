"""Bad input gets a clear Triton-style error, and the server keeps serving."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

GOOD = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}


def call(
    url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any] | None]:
    req = urllib.request.Request(
        f"http://{url}{path}",
        data=body,
        headers=headers or {},
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw) if raw else None


def infer_json(
    url: str, doc: object, model: str = "mlp_classifier"
) -> tuple[int, dict[str, Any] | None]:
    return call(url, f"/v2/models/{model}/infer", json.dumps(doc).encode())


def assert_still_serves(url: str) -> None:
    status, body = infer_json(url, GOOD)
    assert status == 200, body
    assert body is not None
    assert body["outputs"][0]["shape"] == [1, 10]


def with_input(**changes: object) -> dict[str, Any]:
    tensor = dict(GOOD["inputs"][0], **changes)
    return {"inputs": [tensor]}


BAD_REQUESTS = {
    "wrong shape": (
        with_input(shape=[1, 63], data=[0.5] * 63),
        "unexpected shape for input 'INPUT0'",
    ),
    "wrong dtype": (with_input(datatype="INT32", data=[1] * 64), "data-type is 'INT32'"),
    "unknown dtype": (with_input(datatype="FP8"), "invalid datatype for input INPUT0: 'FP8'"),
    "extra input": (
        {
            "inputs": [
                *GOOD["inputs"],
                {"name": "EXTRA", "datatype": "FP32", "shape": [1], "data": [1.0]},
            ]
        },
        "expected 1 inputs but got 2 inputs for model 'mlp_classifier'. "
        "Got input(s) ['EXTRA','INPUT0']",
    ),
    "missing input": (
        {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
        "missing required input(s) ['B']",
    ),
    "unknown output": (
        {**GOOD, "outputs": [{"name": "NOPE"}]},
        "unexpected inference output 'NOPE'",
    ),
    "element count": (with_input(data=[0.5] * 10), "has 10 elements but shape [1, 64] needs 64"),
    "batch too large": (
        with_input(shape=[33, 64], data=[0.5] * 33 * 64),
        "batch-size must be <= 32",
    ),
    "non-numeric data": (with_input(data=["x"] * 64), "FP32 data must be numbers"),
    "no inputs": ({"inputs": []}, "expected 1 inputs but got 0 inputs"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
def test_bad_request_is_400_then_serves(url: str, case: str) -> None:
    doc, message = BAD_REQUESTS[case]
    model = "mixed_add" if case == "missing input" else "mlp_classifier"
    status, body = infer_json(url, doc, model)
    assert status == 400
    assert body is not None
    assert message in body["error"]
    assert_still_serves(url)


def test_malformed_json_is_400(url: str) -> None:
    status, body = call(url, "/v2/models/mlp_classifier/infer", b"{not json")
    assert status == 400
    assert body is not None
    assert "malformed JSON" in body["error"]
    assert_still_serves(url)


def binary_request(
    declared: int, actual: bytes, header_extra: int = 0
) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": declared},
                }
            ]
        }
    ).encode()
    return header + actual, {"Inference-Header-Content-Length": str(len(header) + header_extra)}


@pytest.mark.parametrize(
    ("declared", "actual_len", "header_extra", "message"),
    [
        (256, 200, 0, "runs past the end of the body"),
        (200, 200, 0, "binary data is 200 bytes but shape [1, 64] of FP32 needs 256"),
        (256, 300, 0, "add up to 256"),
        (256, 256, 10_000, "but the body has only"),
    ],
    ids=["short body", "size vs shape", "leftover bytes", "header length past body"],
)
def test_binary_length_mismatch_is_400(
    url: str, declared: int, actual_len: int, header_extra: int, message: str
) -> None:
    body, headers = binary_request(declared, b"\0" * actual_len, header_extra)
    status, doc = call(url, "/v2/models/mlp_classifier/infer", body, headers)
    assert status == 400
    assert doc is not None
    assert message in doc["error"]
    assert_still_serves(url)


def test_good_binary_request_returns_binary_output(url: str) -> None:
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 256},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{url}/v2/models/mlp_classifier/infer",
        data=header + x.tobytes(),
        method="POST",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        length = int(resp.headers["Inference-Header-Content-Length"])
        raw = resp.read()
    doc = json.loads(raw[:length])
    out = doc["outputs"][0]
    assert out["parameters"] == {"binary_data_size": 40}
    assert "data" not in out
    probs = np.frombuffer(raw[length:], dtype=np.float32)
    assert probs.shape == (10,)
    assert abs(float(probs.sum()) - 1.0) < 1e-5
    assert struct.calcsize("<10f") == len(raw) - length


def test_unknown_model_and_version_are_404_a_version_not_digits_no_route(url: str) -> None:
    status, body = infer_json(url, GOOD, "no_such_model")
    assert status == 404
    assert body is not None
    assert body["error"] == "Request for unknown model: 'no_such_model' is not found"
    status, body = call(
        url, "/v2/models/mlp_classifier/versions/9/infer", json.dumps(GOOD).encode()
    )
    assert status == 404
    assert body is not None
    assert body["error"] == "Request for unknown model: 'mlp_classifier' version 9 is not found"
    status, body = call(url, "/v2/models/mlp_classifier/versions/x/config")
    assert status == 404  # Triton's routes take digits only: no route
    assert body == {"error": "Not Found"}
    assert_still_serves(url)


def test_body_over_limit_is_413(url: str) -> None:
    # The test agent's limit is 1 MiB.
    big = with_input(shape=[32, 64], data=[0.5] * 32 * 64)
    big["pad"] = "x" * (2 << 20)
    status, body = infer_json(url, big)
    assert status == 413
    assert body is not None
    assert "over the limit" in body["error"]
    assert_still_serves(url)


def test_unknown_route_is_json_404(url: str) -> None:
    status, body = call(url, "/v2/nothing/here")
    assert status == 404
    assert body is not None
    assert "error" in body
