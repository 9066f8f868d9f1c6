"""In-process sessions that fail at run time: judged by a probe on zeros, rebuilt with back-off.

`SessionGuard` is driven through its two seams (the probe and the rebuild, plain callables here);
`OnnxBackend` with a real ONNX Runtime session whose runs fail on the request's own data.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.backends.health import ChangeKind, HealthChange, RestartPolicy
from agent.backends.onnx import OnnxBackend
from agent.backends.session_health import SessionGuard
from agent.errors import BackendError, ModelLoadError, ModelNotReadyError
from agent.proto import model_config_pb2 as mc
from tests.models import save_ready
from tests.support import wait_until

FAST = RestartPolicy(backoff_s=0.01, backoff_max_s=0.02, restart_limit=2)


class Session:
    """What the guard probes and rebuilds: `broken` until a rebuild, `rebuilds_fail` times."""

    def __init__(self, *, rebuilds_fail: int = 0) -> None:
        self.broken = False
        self.rebuilds = 0
        self.rebuilds_fail = rebuilds_fail
        self.lock = threading.Lock()

    def probe(self) -> None:
        if self.broken:
            raise RuntimeError("CUDA failure 700: an illegal memory access was encountered")

    def rebuild(self) -> None:
        with self.lock:
            self.rebuilds += 1
            if self.rebuilds <= self.rebuilds_fail:
                raise ModelLoadError("cannot create an execution context")
            self.broken = False


def guarded(
    session: Session, changes: list[HealthChange], *, probe_ok: bool = True
) -> SessionGuard:
    return SessionGuard(
        "model 'm' (test)",
        FAST,
        probe=session.probe,
        rebuild=session.rebuild,
        listener=changes.append,
        probe_ok=probe_ok,
    )


def test_a_failure_the_probe_does_not_share_is_the_requests_own() -> None:
    changes: list[HealthChange] = []
    guard = guarded(Session(), changes)
    guard.failed(BackendError("onnxruntime failed: indices element out of data bounds"))
    assert guard.state.ready
    assert changes == []
    guard.wait_ready()  # returns at once


def test_a_session_that_fails_its_probe_is_rebuilt_and_serves_again() -> None:
    changes: list[HealthChange] = []
    session = Session()
    guard = guarded(session, changes)
    session.broken = True
    guard.failed(BackendError("onnxruntime failed: CUDA error"))
    assert changes[0].kind is ChangeKind.FAILED
    assert "the health probe failed too" in changes[0].reason
    assert "illegal memory access" in changes[0].reason
    guard.wait_ready()  # waits for the rebuild (bounded)
    assert guard.state.ready
    wait_until(lambda: len(changes) == 2, "the restarted change")
    assert [c.kind for c in changes] == [ChangeKind.FAILED, ChangeKind.RESTARTED]
    assert session.rebuilds == 1


def test_rebuilds_that_keep_failing_give_the_version_up() -> None:
    changes: list[HealthChange] = []
    session = Session(rebuilds_fail=99)
    guard = guarded(session, changes)
    session.broken = True
    guard.failed(BackendError("onnxruntime failed: CUDA error"))
    wait_until(lambda: changes and changes[-1].kind is ChangeKind.GAVE_UP, "the crash loop")
    # The first failure, then each rebuild that failed: the last one past the limit gives up.
    kinds = [c.kind for c in changes]
    assert kinds == [ChangeKind.FAILED, ChangeKind.FAILED, ChangeKind.GAVE_UP]
    assert session.rebuilds == FAST.restart_limit
    with pytest.raises(ModelNotReadyError, match="given up") as refused:
        guard.wait_ready()
    assert "cannot create an execution context" in refused.value.message


def test_without_a_probe_that_passed_at_load_failures_are_never_judged() -> None:
    changes: list[HealthChange] = []
    session = Session()
    session.broken = True
    guard = guarded(session, changes, probe_ok=False)
    guard.failed(BackendError("onnxruntime failed"))
    assert guard.state.ready
    assert changes == []
    assert session.rebuilds == 0


def gather_model() -> onnx.ModelProto:
    """INT64 [n] indices into four floats: an index out of range fails that request alone."""
    data = helper.make_tensor("data", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "I"], ["Y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("I", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"])],
        [data],
    )
    return save_ready(graph)


def test_onnx_runtime_run_failures_on_the_requests_data_leave_the_session_serving(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(gather_model(), path)
    changes: list[HealthChange] = []
    backend = OnnxBackend(
        path, mc.ModelConfig(name="g"), 1, restart_policy=FAST, health_listener=changes.append
    )
    try:
        assert backend.health.ready
        good = backend.run({"I": np.array([0, 3], dtype=np.int64)}, ["Y"])
        np.testing.assert_array_equal(good[0], np.array([1.0, 4.0], dtype=np.float32))
        with pytest.raises(BackendError, match="onnxruntime failed"):
            backend.run({"I": np.array([9], dtype=np.int64)}, ["Y"])
        assert backend.health.ready
        assert changes == []
        again = backend.run({"I": np.array([1], dtype=np.int64)}, ["Y"])
        np.testing.assert_array_equal(again[0], np.array([2.0], dtype=np.float32))
    finally:
        backend.close()
