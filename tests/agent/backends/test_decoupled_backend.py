"""The Python backend's decoupled mode, driven directly (one real worker process), and the
response sender's checks in `pb_utils`."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from agent import pb_utils
from agent.backends.base import response_parameters
from agent.backends.python.backend import PythonBackend
from agent.errors import AgentError
from agent.proto import model_config_pb2 as mc
from agent.tensors.request import RequestContext
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.python_models import write_python_model


class Collector:
    """A ResponseSink that keeps what it gets."""

    def __init__(self) -> None:
        self.items: list[tuple[int | None, str | None, bool]] = []
        self.done = threading.Event()
        self.cancel: list[object] = []
        self.names: list[list[str]] = []  # the outputs of each response with outputs

    def put(
        self, outputs: dict[str, np.ndarray] | None, error: AgentError | None, final: bool
    ) -> None:
        value = None if outputs is None else int(outputs["OUT"].flat[0])
        if outputs is not None:
            self.names.append(list(outputs))
        self.items.append((value, None if error is None else error.message, final))
        if final:
            self.done.set()

    def on_cancel(self, cancel: object) -> None:
        self.cancel.append(cancel)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[PythonBackend]:
    # UNSENT: declared, never sent by the model.
    declared = decoupled_config("streamer", tmp_path).replace(
        "output [ ", 'output [ { name: "UNSENT" data_type: TYPE_INT32 dims: [ 1 ] }, '
    )
    model_dir = write_python_model(tmp_path, "streamer", DECOUPLED_MODEL, declared)
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    backend = PythonBackend(model_dir / "1", config)
    try:
        yield backend
    finally:
        backend.close()


def feeds(n: int, mode: int, error_at: int = -1) -> dict[str, np.ndarray]:
    return {
        "N": np.array([[n]], np.int32),
        "MODE": np.array([[mode]], np.int32),
        "ERROR_AT": np.array([[error_at]], np.int32),
    }


def test_one_execute_streams_to_each_request_of_a_batch(backend: PythonBackend) -> None:
    sinks = [Collector() for _ in range(3)]
    backend.run_decoupled([(feeds(k + 1, 0), ["OUT"], s) for k, s in enumerate(sinks)])
    for k, sink in enumerate(sinks):
        assert sink.done.wait(30)
        assert sink.items == [*((i, None, False) for i in range(k + 1)), (None, None, True)]


def test_a_response_holds_the_requested_outputs_the_model_sent(backend: PythonBackend) -> None:
    # As Triton: UNSENT is left out of each response, not an error.
    sink = Collector()
    backend.run_decoupled([(feeds(2, 0), ["UNSENT", "OUT"], sink)])
    assert sink.done.wait(30)
    assert sink.items == [(0, None, False), (1, None, False), (None, None, True)]
    assert sink.names == [["OUT"], ["OUT"]]


def test_execute_that_raises_ends_every_request_with_its_error(backend: PythonBackend) -> None:
    sinks = [Collector(), Collector()]
    backend.run_decoupled([(feeds(1, 4), ["OUT"], s) for s in sinks])
    for sink in sinks:
        assert sink.done.wait(30)
        ((value, error, final),) = sink.items
        assert (value, final) == (None, True)
        assert error == "TritonModelException: execute gave up"


def test_a_dead_worker_ends_the_open_requests_and_a_new_one_takes_the_next(
    backend: PythonBackend,
) -> None:
    sink = Collector()
    backend.run_decoupled([(feeds(5, 2), ["OUT"], sink)])  # streams until cancelled
    (pid,) = backend.worker_pids
    os.kill(pid, signal.SIGKILL)
    assert sink.done.wait(30)
    assert sink.items[-1][2] is True
    assert "killed by signal 9" in str(sink.items[-1][1])
    # The instance restarts by itself: the next request waits for the new worker (bounded).
    later = Collector()
    backend.run_decoupled([(feeds(1, 0), ["OUT"], later)])
    assert later.done.wait(30)
    assert later.items == [(0, None, False), (None, None, True)]
    (new,) = backend.worker_pids
    assert new != pid


def test_the_sender_s_checks_use_triton_s_words() -> None:
    sent: list[tuple[object, bool]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, f: sent.append((r, f)), lambda: False)
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag provided"):
        sender.send(pb_utils.InferenceResponse([]), flags=2)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided when the response"):
        sender.send()
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(
        pb_utils.TritonModelException,
        match=re.escape("Unable to send response. Response sender has been closed."),
    ):
        sender.send(pb_utils.InferenceResponse([]))
    assert sent == [(None, True)]
    assert sender.is_closed()


def test_a_request_built_by_the_model_has_no_response_sender() -> None:
    request = pb_utils.InferenceRequest([], ["OUT"])
    with pytest.raises(pb_utils.TritonModelException, match="only available"):
        request.get_response_sender()
    assert request.is_cancelled() is False


def test_a_sender_of_a_model_that_is_not_decoupled_sends_one_response() -> None:
    sender = pb_utils.InferenceResponseSender(lambda r, f: None, lambda: False, decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(pb_utils.InferenceResponse([]))
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse([]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


SENDER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out = pb_utils.Tensor("Y", (x * 2).astype(np.float32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""


def test_a_model_that_is_not_decoupled_may_answer_through_its_sender(tmp_path: Path) -> None:
    config = text_format.Parse(
        """
        name: "sender" backend: "python" max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
        """,
        mc.ModelConfig(),
    )
    model_dir = write_python_model(tmp_path, "sender", SENDER_MODEL, "")
    backend = PythonBackend(model_dir / "1", config)
    try:
        x = np.array([[1.0, 2.0]], np.float32)
        answers = backend.run_requests([({"X": x}, ["Y"]), ({"X": x + 1}, ["Y"])])
    finally:
        backend.close()
    assert [a["Y"].tolist() for a in answers if isinstance(a, dict)] == [[[2.0, 4.0]], [[4.0, 6.0]]]


# Streams one response per request: its id, parameters (JSON) and correlation id, as it read them.
CONTEXT_STREAMER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            told = f"{request.request_id()}|{request.parameters()}|{request.correlation_id()}"
            out = pb_utils.Tensor("TOLD", np.array([told.encode()], dtype=np.object_))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out], parameters={"streamed": True, "n": 2}),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""
CONTEXT_STREAMER_CONFIG = """
name: "told"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOLD" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""


class Told:
    """A ResponseSink that keeps the one TOLD text it gets."""

    def __init__(self) -> None:
        self.text = ""
        self.parameters: dict[str, object] | None = None
        self.done = threading.Event()

    def put(
        self, outputs: dict[str, np.ndarray] | None, error: AgentError | None, final: bool
    ) -> None:
        assert error is None, error
        if outputs is not None:
            self.text = outputs["TOLD"].flat[0].decode()
            self.parameters = response_parameters(outputs)
        if final:
            self.done.set()

    def on_cancel(self, cancel: object) -> None:
        pass


def test_a_decoupled_model_reads_each_request_s_context_and_answers_parameters(
    tmp_path: Path,
) -> None:
    model_dir = write_python_model(tmp_path, "told", CONTEXT_STREAMER, CONTEXT_STREAMER_CONFIG)
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    backend = PythonBackend(model_dir / "1", config)
    try:
        sinks = [Told(), Told()]
        x = {"X": np.array([1], np.int32)}
        backend.run_decoupled(
            [(x, ["TOLD"], sink) for sink in sinks],
            contexts=[RequestContext("req-7", {"tag": "a", "n": 3}, 42), None],
        )
        for sink in sinks:
            assert sink.done.wait(30)
    finally:
        backend.close()
    assert sinks[0].text == 'req-7|{"tag": "a", "n": 3}|42'
    assert sinks[1].text == "|{}|0"  # Triton's defaults for a request that carries none
    # The response's own parameters travel with it (InferenceResponse(parameters=...)).
    assert [sink.parameters for sink in sinks] == [{"streamed": True, "n": 2}] * 2
