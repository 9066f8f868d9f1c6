"""Worker process of a Python model instance: `python -m agent.backends.python.worker.main FD PPID`.

FD is this end of a socketpair inherited from the agent, PPID the agent's pid. The worker:

1. asks the kernel to SIGKILL it when the agent's launching thread dies (Linux
   PR_SET_PDEATHSIG; best effort, for user code stuck where the closed pipe cannot be seen);
2. reads its first message: AUTOCOMPLETE (a worker started only for that, as Triton's
   auto-complete stub) imports the model file, runs `TritonPythonModel.auto_complete_config` on
   the config, answers COMPLETED with the config or ERROR, and exits; INIT imports the model file,
   instantiates `TritonPythonModel` and calls its `initialize(args)`; answers READY, or ERROR
   with the reason (and exits);
3. serves EXECUTE messages one at a time: the requests of one batch, each its own
   `InferenceRequest`, go to one `execute` call; RESULT carries one response per request (its
   tensors, or its error), ERROR the exception's type and message when `execute` raised;
4. on FINALIZE calls `finalize()`, answers FINALIZED and exits; when the pipe closes (agent gone)
   it exits without finalizing.

The main thread reads the pipe itself while it waits for work, and a relief thread reads it
while the main thread is busy for long or waits for a reply
(`agent.backends.python.worker.mailbox`), so a short `execute` costs no thread switch and the
agent never blocks writing to this worker. The agent's heartbeat PINGs are answered (PONG) by a
thread of their own as soon as they are read, also while `execute` runs: a slow `execute` keeps
answering, a stopped or wedged process does not (the agent then kills and replaces it,
`agent.backends.python.supervisor`). Inside `execute`,
`pb_utils.InferenceRequest.exec` / `async_exec` send BLS messages and wait for their BLS_RESULT
(`agent.backends.python.worker.bls_client`; `async def execute` runs on one event loop per
worker). A CANCEL from the agent marks requests of the running execute (`request.is_cancelled()`).
`pb_utils.Logger` lines travel to the agent as LOG messages, which the agent writes to its log
with the model's name. Custom metrics (`pb_utils.MetricFamily`) changed since the last message
go before each message as one METRICS message (`agent.pb_utils.metrics`); `Metric.value()` asks the
agent for the total of every instance while the agent listens (METRIC_VALUE). `import
triton_python_backend_utils` is `agent.pb_utils` here.

Only numpy and the small agent modules it needs are imported here, to keep start-up short.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import inspect
import itertools
import json
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agent import pb_utils
from agent.backends.python import ipc
from agent.backends.python.worker import bls_client, decoupled
from agent.backends.python.worker.mailbox import Mailbox
from agent.pb_utils import metrics as pb_metrics
from agent.pb_utils.request import received_request
from agent.pb_utils.response import parameters_of

_PR_SET_PDEATHSIG = 1
_TRITON_MODULE = "triton_python_backend_utils"


class _Wire:
    """This worker's end of the pipe; sends are locked (user threads may log meanwhile)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: ipc.Message) -> None:
        with self._lock:
            # Custom metrics changed since the last message go first (coalesced: one message
            # however many updates), so the agent has them before the response they go with.
            updates = pb_metrics.take_updates()
            if updates is not None:
                ipc.send(self.conn, ipc.Message(ipc.METRICS, updates))
            ipc.send(self.conn, message)

    def log(self, level: pb_utils.LogLevel, message: str, filename: str, line: int) -> None:
        meta = {"level": level.name, "message": message, "file": filename, "line": line}
        with contextlib.suppress(OSError):  # the agent is gone: the next receive ends the worker
            self.send(ipc.Message(ipc.LOG, meta))


def main(argv: list[str]) -> int:
    """Run the worker; returns the exit status."""
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print("usage: python -m agent.backends.python.worker.main FD PARENT_PID", file=sys.stderr)
        return 2
    conn = Connection(int(argv[0]))
    _die_with_parent(int(argv[1]))
    # Models written for Triton import the utilities under Triton's name: the same module.
    sys.modules.setdefault(_TRITON_MODULE, pb_utils)
    wire = _Wire(conn)
    pb_utils.set_log_sink(wire.log)
    running = _Running()
    cancels = _Cancels(running)
    pongs = _Pongs(wire)
    # The pipe is read at all times, by this thread or a relief thread (python_mailbox says why).
    mailbox = Mailbox(conn, on_cancel=cancels.route, on_ping=pongs.ping)
    mailbox.start()
    ids = itertools.count(1)  # ids of calls to the agent (BLS, metric values)
    bls = bls_client.BlsClient(wire.send, mailbox, ids)
    totals = _MetricTotals(wire, mailbox, ids)
    try:
        init = mailbox.receive()
    except EOFError:
        return 0
    if init.kind == ipc.AUTOCOMPLETE:
        wire.send(_auto_complete(init))
        return 0
    with totals.listening():  # the agent reads the pipe until READY
        model = _load(wire, init)
    if model is None:
        return 1
    # Decoupled models answer through response senders (agent.backends.python.worker.decoupled).
    cancels.decoupled = _decoupled_runtime(wire, init)
    if cancels.decoupled is not None:
        bls.begin()  # as Triton: BLS from `execute` and from the model's threads at any time
    while True:
        try:
            message = mailbox.receive()
        except (EOFError, OSError, ipc.WireError):
            return 0  # the agent closed the pipe: no finalize, nothing to answer
        if message.kind == ipc.EXECUTE and cancels.decoupled is not None:
            try:
                with totals.listening():
                    answer = cancels.decoupled.execute(model, message)
            finally:
                running.end()
            wire.send(answer)
        elif message.kind == ipc.EXECUTE:
            bls.begin()
            try:
                with totals.listening():
                    answer = _execute(model, message, running)
            finally:
                bls.end()
                running.end()
            wire.send(answer)
        elif message.kind == ipc.FINALIZE:
            _finalize(model)
            wire.send(ipc.Message(ipc.FINALIZED))
            return 0
        else:
            wire.send(_error(f"unexpected message {message.kind!r}"))


def _decoupled_runtime(wire: _Wire, init: ipc.Message) -> decoupled.DecoupledRuntime | None:
    args = dict(init.meta.get("args", {}))
    try:
        config = json.loads(str(args.get("model_config", "{}")))
    except ValueError:
        return None
    if not isinstance(config, dict) or not pb_utils.using_decoupled_model_transaction_policy(
        config
    ):
        return None
    name = str(args.get("model_name", ""))
    return decoupled.DecoupledRuntime(wire.send, name, _response_tensors, _run_coroutine)


class _Pongs:
    """Answers the agent's PINGs from a thread of its own (whoever reads the pipe never writes)."""

    def __init__(self, wire: _Wire) -> None:
        self._wire = wire
        self._pings: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def ping(self, message: ipc.Message) -> None:
        """A PING, from the reading thread: queued for the answering thread (started at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._answer, name="pong", daemon=True)
            self._thread.start()
        self._pings.put(message.meta.get("n"))

    def _answer(self) -> None:
        while True:
            number = self._pings.get()
            try:
                self._wire.send(ipc.Message(ipc.PONG, {"n": number}))
            except OSError:
                return  # the agent is gone: the main loop ends the worker


class _Running:
    """The requests of the running `execute`, which CANCEL messages mark (the reading thread).

    EXECUTE and CANCEL carry the agent's sequence number of the execute: a CANCEL read before
    the main loop has built the requests waits for them; one for an execute already answered is
    ignored.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = -1
        self._requests: list[pb_utils.InferenceRequest] = []
        self._early: dict[int, set[int]] = {}

    def start(self, seq: int, requests: list[pb_utils.InferenceRequest]) -> None:
        with self._lock:
            self._seq, self._requests = seq, requests
            for index in self._early.pop(seq, set()):
                self._mark(index)
            self._early.clear()

    def end(self) -> None:
        with self._lock:
            self._seq, self._requests = -1, []

    def cancel(self, message: ipc.Message) -> None:
        seq = message.meta.get("seq")
        indices = [i for i in message.meta.get("requests") or [] if isinstance(i, int)]
        if not isinstance(seq, int):
            return
        with self._lock:
            if seq == self._seq:
                for index in indices:
                    self._mark(index)
            elif seq > self._seq:
                self._early.setdefault(seq, set()).update(indices)

    def _mark(self, index: int) -> None:
        if 0 <= index < len(self._requests):
            self._requests[index].set_cancelled()


class _MetricTotals:
    """`Metric.value()` asks the agent for the total of every instance while the agent listens
    (during `initialize` and `execute`); otherwise this worker's own share answers."""

    _WAIT_S = 5.0  # the agent answers at once while it listens; this only bounds a lost race

    def __init__(self, wire: _Wire, mailbox: Mailbox, ids: Iterator[int]) -> None:
        self._wire = wire
        self._mailbox = mailbox
        self._ids = ids
        self._open = False

    def listening(self) -> _MetricTotals:
        """`with totals.listening():` around `initialize` and `execute` (a plain context
        manager, not a generator: it wraps every execute)."""
        return self

    def __enter__(self) -> None:
        self._open = True
        pb_metrics.set_total_source(self.total)

    def __exit__(self, *exc: object) -> None:
        self._open = False
        pb_metrics.set_total_source(None)

    def total(self, family: str, labels: dict[str, str]) -> float | None:
        if not self._open:
            return None
        call_id = next(self._ids)
        slot = self._mailbox.expect(call_id)
        meta = {"id": call_id, "family": family, "labels": labels}
        try:
            self._wire.send(ipc.Message(ipc.METRIC_VALUE, meta))
            reply = slot.result(self._WAIT_S)
        except (OSError, FutureTimeout):
            self._mailbox.forget(call_id)
            return None
        value = reply.meta.get("value")
        return float(value) if isinstance(value, int | float) else None


class _Cancels:
    """Routes CANCEL (the reading thread): a decoupled model's by request id, others by execute."""

    def __init__(self, running: _Running) -> None:
        self.running = running
        self.decoupled: decoupled.DecoupledRuntime | None = None

    def route(self, message: ipc.Message) -> None:
        if self.decoupled is not None and "id" in message.meta:
            self.decoupled.cancel(message)
        else:
            self.running.cancel(message)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the agent died before prctl took effect
        os._exit(0)


def _import_model(path: Path) -> Any:
    """The model file's module (its version folder importable, as in Triton)."""
    sys.path.insert(0, str(path.parent))
    pb_utils.set_model_dir(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_edge_agent_model_{os.getpid()}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle look classes up there
    spec.loader.exec_module(module)
    return module


def _auto_complete(message: ipc.Message) -> ipc.Message:
    """Run `TritonPythonModel.auto_complete_config` (when defined) on the config; COMPLETED."""
    try:
        module = _import_model(Path(str(message.meta["model_file"])))
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            return _error("defines no class TritonPythonModel")
        config = pb_utils.ModelConfig(str(message.meta["config"]))
        complete = getattr(cls, "auto_complete_config", None)
        if complete is not None:
            config = complete(config)
        if not isinstance(config, pb_utils.ModelConfig):
            name = message.meta.get("model_name", "")
            return _error(
                f"auto_complete_config function in model '{name}' must return a valid "
                "pb.ModelConfig object."
            )
        return ipc.Message(ipc.COMPLETED, {"config": json.dumps(config.as_dict())})
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is the load's reason
        traceback.print_exc()
        return _error(_describe(exc))


def _load(wire: _Wire, init: ipc.Message) -> Any:
    """Import the model file and initialize the model; None (after answering ERROR) on failure."""
    if init.kind != ipc.INIT:
        wire.send(_error(f"expected {ipc.INIT!r}, got {init.kind!r}"))
        return None
    path = Path(str(init.meta["model_file"]))
    args = {str(k): str(v) for k, v in dict(init.meta["args"]).items()}
    try:
        module = _import_model(path)
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            wire.send(_error("defines no class TritonPythonModel"))
            return None
        model = cls()
        initialize = getattr(model, "initialize", None)
        if initialize is not None:
            initialize(args)
        if not callable(getattr(model, "execute", None)):
            wire.send(_error("TritonPythonModel has no execute method"))
            return None
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is the load's reason
        traceback.print_exc()
        wire.send(_raised(exc))  # Triton's words: the version's reason is the model's error
        return None
    wire.send(ipc.Message(ipc.READY))
    return model


def _execute(model: Any, message: ipc.Message, running: _Running) -> ipc.Message:
    """One `execute` call on the message's requests (several when a dynamic batch formed).

    meta {"requests": [{"outputs": [...], "inputs": N}, ...]}, the inputs of each request in
    order; a request may also carry "request_id", "parameters" and "correlation_id" (what the
    model reads off it); without "requests", one request with meta "outputs" and every tensor.
    The answer is RESULT with meta {"responses": [{"tensors": N, "parameters"?: {...}} or
    {"error": "..."}]} and the outputs of each response in order, or ERROR when `execute` raised
    or returned the wrong number of responses.
    """
    described = message.meta.get("requests")
    if not isinstance(described, list):
        described = [{"outputs": message.meta.get("outputs", []), "inputs": len(message.tensors)}]
    requests = []
    tensor = pb_utils.Tensor
    offset = 0
    # What a request's response sender sent (Triton allows a model that is not decoupled to
    # answer through it): the sender is made only if the model asks for it.
    sent: dict[int, pb_utils.InferenceResponse] = {}
    make_sender = functools.partial(_response_sender, sent)
    for item in described:
        count = int(item.get("inputs", 0))
        inputs = [tensor(n, a) for n, a in message.tensors[offset : offset + count]]
        offset += count
        index = item.get("trace")  # set when the agent traces this request
        trace = pb_utils.InferenceTrace(index) if isinstance(index, int) else None
        outputs = [str(n) for n in item["outputs"]]
        request = received_request(inputs, outputs, item, trace)
        request.set_response_sender_factory(make_sender)
        requests.append(request)
    seq = message.meta.get("seq")
    running.start(seq if isinstance(seq, int) else -1, requests)
    try:
        responses = model.execute(requests)
        # `async def execute`, as Triton allows (a plain list, the usual answer, never is).
        if type(responses) is not list and inspect.isawaitable(responses):
            responses = _run_coroutine(responses)
    except Exception as exc:  # noqa: BLE001 - user code: report it, stay alive
        traceback.print_exc()
        return _raised(exc)
    if responses is None and sent:  # answered through response senders (Triton allows)
        responses = [sent.get(id(request)) for request in requests]
    if not isinstance(responses, list | tuple) or len(responses) != len(requests):
        return _error(
            f"execute must return a list of {len(requests)} InferenceResponse, "
            f"got {_kind_of(responses)}"
            + (f" of {len(responses)}" if isinstance(responses, list | tuple) else "")
        )
    answers: list[dict[str, Any]] = []
    tensors: list[tuple[str, Any]] = []
    for response in responses:
        outcome = _response_tensors(response)
        if isinstance(outcome, dict):
            answers.append(outcome)
        else:
            answers.append({"tensors": len(outcome)})
            tensors.extend(outcome)
            params = parameters_of(response)
            if params:  # the model's response parameters (rare: most set none)
                answers[-1]["parameters"] = params
    return ipc.Message(ipc.RESULT, {"responses": answers}, tensors)


def _response_sender(
    sent: dict[int, pb_utils.InferenceResponse], request: pb_utils.InferenceRequest
) -> pb_utils.InferenceResponseSender:
    """The response sender of a request of a model that is not decoupled: what it sends (one
    response at most, Triton's checks) lands in `sent`, under the request's id(); the requests
    outlive the `execute` call, so no id is reused meanwhile."""

    def keep(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is not None:
            sent[id(request)] = response

    return pb_utils.InferenceResponseSender(keep, request.is_cancelled, decoupled=False)


_loop: Any = None


def _run_coroutine(awaitable: Any) -> Any:
    """Run an `async def execute` to completion on this worker's one event loop."""
    global _loop  # noqa: PLW0603 - one loop per worker, made on first use
    import asyncio  # noqa: PLC0415 - only models with async execute need it

    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(awaitable)


def _response_tensors(response: Any) -> list[tuple[str, Any]] | dict[str, Any]:
    """A response's output tensors, or the answer saying why there are none: {"error": text},
    with "code" (Triton's) when the model reported the error itself."""
    if not isinstance(response, pb_utils.InferenceResponse):
        return {"error": f"execute returned {_kind_of(response)} instead of an InferenceResponse"}
    error = response.error()
    if error is not None:
        if isinstance(error, pb_utils.ModelError):
            return {"error": error.message(), "code": error.code()}
        return {"error": str(error), "code": pb_utils.ModelError.INTERNAL}
    tensors = []
    for tensor in response.output_tensors():
        if not isinstance(tensor, pb_utils.Tensor):
            return {"error": f"output {_kind_of(tensor)} is not a pb_utils.Tensor"}
        array = tensor.as_numpy()
        try:
            pb_utils.numpy_to_kserve(array.dtype)
        except ValueError as exc:
            return {"error": f"output '{tensor.name()}': {exc}"}
        tensors.append((tensor.name(), array))
    return tensors


def _raised(exc: BaseException) -> ipc.Message:
    """ERROR for an exception `initialize` or `execute` raised, in Triton's words: "<Type>:
    <message>" and the model's frames, innermost first ("At:\n  <file>(<line>): <function>").
    Raised, a TritonError is INTERNAL as any exception: its code counts only in a response
    (Triton's TritonError cannot be raised at all)."""
    # The model's frames only: [0] is the worker calling it; then none of this module's (the
    # import of the model file) nor importlib's.
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)[1:]
        if f.filename != __file__ and not f.filename.startswith("<frozen ")
    ]
    where = "".join(f"\n  {f.filename}({f.lineno}): {f.name}" for f in reversed(frames))
    text = _describe(exc) + (f"\n\nAt:{where}\n" if where else "")
    return _error(text, user=True)


def _finalize(model: Any) -> None:
    finalize = getattr(model, "finalize", None)
    if finalize is None:
        return
    try:
        finalize()
    except Exception:  # noqa: BLE001 - user code: the worker ends anyway
        traceback.print_exc()


def _error(message: str, *, user: bool = False) -> ipc.Message:
    return ipc.Message(ipc.ERROR, {"message": message, "user": user})


def _describe(exc: BaseException) -> str:
    text = exc.message() if isinstance(exc, pb_utils.ModelError) else str(exc)
    kind = "TritonError" if type(exc) is pb_utils.ModelError else type(exc).__name__
    return f"{kind}: {text}" if text else kind


def _kind_of(value: object) -> str:
    return type(value).__name__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
