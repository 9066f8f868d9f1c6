"""ONNX Runtime threads (agent.backends.onnx): a run that starts alone gets every core, runs
beside others their instance's share, and an explicit thread count pins both."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.backends.base import CountsExtraRuns
from agent.backends.onnx import InFlight, OnnxBackend, ThreadPlan, thread_plan
from agent.errors import ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.runtime.demo import mlp_model


def _config(parameter: str | None = None) -> mc.ModelConfig:
    config = mc.ModelConfig(name="mlp")
    if parameter is not None:
        config.parameters["intra_op_thread_count"].string_value = parameter
    return config


def test_by_default_a_lone_run_gets_every_core_and_busy_runs_share_them() -> None:
    assert thread_plan(_config(), instances=2, cores=4) == ThreadPlan(busy=2, alone=4)
    assert thread_plan(_config(), instances=3, cores=2) == ThreadPlan(busy=1, alone=2)
    one = thread_plan(_config(), instances=1, cores=4)
    assert one == ThreadPlan(4, 4)
    assert not one.lone_session  # one instance: one session of every core


def test_an_explicit_thread_count_pins_every_run() -> None:
    assert thread_plan(_config(), instances=2, setting=3, cores=8) == ThreadPlan(3, 3)
    # The config's parameter (Triton's ONNX Runtime backend's) wins over the agent's setting.
    assert thread_plan(_config("1"), instances=2, setting=3, cores=8) == ThreadPlan(1, 1)
    # 0 leaves it to the setting, or to the cores.
    assert thread_plan(_config("0"), instances=2, setting=3, cores=8) == ThreadPlan(3, 3)
    assert thread_plan(_config(" 0 "), instances=2, cores=8) == ThreadPlan(4, 8)


@pytest.mark.parametrize("text", ["-1", "two", "", "257", "100000", str(2**20)])
def test_a_bad_thread_count_parameter_refuses_the_version(text: str) -> None:
    # ONNX Runtime would create every thread of a huge count: the load hangs or the process ends.
    with pytest.raises(
        ModelLoadError, match="'intra_op_thread_count' must be an integer from 0 to 256, got"
    ):
        thread_plan(_config(text), instances=1)


def test_in_flight_says_whether_a_run_starts_alone() -> None:
    runs = InFlight(quiet_s=0.5)
    assert runs.start(now=0.0)  # alone
    runs.end()
    assert runs.start(now=1.0)  # alone again: nothing overlapped yet
    assert not runs.start(now=1.1)  # beside the first
    runs.end()
    runs.end()
    # Runs overlapped lately: the next one is not alone although none is in flight.
    assert not runs.start(now=1.5)
    runs.end()
    assert runs.start(now=1.6)  # 0.5 s since the overlap
    runs.end()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("mlp") / "model.onnx"
    path.write_bytes(mlp_model().SerializeToString())
    return path


def test_a_lone_session_answers_as_the_shared_one_and_counts_one_run_more(
    model_path: Path,
) -> None:
    backend = OnnxBackend(model_path, _config(), intra_op_threads=1, lone_intra_op_threads=2)
    pinned = OnnxBackend(model_path, _config(), intra_op_threads=1)
    try:
        assert backend.threads == ThreadPlan(1, 2)
        assert isinstance(backend, CountsExtraRuns)
        assert (backend.extra_runs, pinned.extra_runs) == (1, 0)
        x = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
        expected = pinned.run({"INPUT0": x}, ["OUTPUT0"])[0]
        # Alone and side by side (some of these start beside others): the same answers.
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: backend.run({"INPUT0": x}, ["OUTPUT0"])[0], range(32)))
        for out in outs:
            np.testing.assert_allclose(out, expected, rtol=1e-6)
        backend.release_memory()  # shrinks both sessions' arenas
    finally:
        backend.close()
        pinned.close()


def test_a_lone_run_s_threads_spin_while_it_runs_and_busy_runs_threads_sleep(
    model_path: Path,
) -> None:
    backend = OnnxBackend(model_path, _config(), intra_op_threads=1, lone_intra_op_threads=2)
    try:
        lone = backend._lone  # private: the test reads the sessions' options
        busy = backend._session
        assert lone is not None

        def entry(session: ort.InferenceSession, key: str) -> str:
            return str(session.get_session_options().get_session_config_entry(key))

        # The lone run's threads spin between operators and stop when it returns; a busy run's
        # never take a core from the event loop.
        assert entry(lone, "session.intra_op.allow_spinning") == "1"
        assert entry(lone, "session.force_spinning_stop") == "1"
        assert entry(busy, "session.intra_op.allow_spinning") == "0"
    finally:
        backend.close()


def test_no_lone_session_when_it_would_not_have_more_threads(model_path: Path) -> None:
    backend = OnnxBackend(model_path, _config(), intra_op_threads=2, lone_intra_op_threads=2)
    try:
        assert (backend.threads, backend.extra_runs) == (ThreadPlan(2, 2), 0)
    finally:
        backend.close()
