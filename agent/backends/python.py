"""Python backend (`backend: "python"`): user code in one worker process per model instance.

A version folder holds `model.py` (or the config's `default_model_filename`) defining
`TritonPythonModel` (see `agent.pb_utils`). Inputs and outputs come from config.pbtxt, which must
declare them, or from the model's `auto_complete_config`: there is no model file to read them from.

Auto-complete: as Triton's auto-complete stub, one short-lived worker imports the file and runs
`TritonPythonModel.auto_complete_config` on the config (as JSON) before any instance starts; its
errors fail the load with the model's message. Its result is `declared_config`, which the loader
completes and serves (`agent.models.loader`).

Processes: an instance group count of N starts N workers (`python -m
agent.backends.python_worker`, a fresh interpreter: never a fork of the threaded agent). The
scheduler runs at most N batches at once, one per executor thread; each batch takes a free
worker, which passes its requests to ONE `execute` call, each its own `InferenceRequest` (as
Triton's Python backend does: `run_requests`, which the scheduler calls instead of merging the
batch), and waits for their responses. Tensors travel over
a socketpair as raw buffers (`agent.backends.python_ipc` says why not shared memory).

BLS: while it waits for an `execute` answer, the backend runs the model's BLS requests through
the `bls` callable it was given (the data plane, `agent.backends.python_bls`).

Cancellation: `run_requests` takes one `CancelSignal` per request from the scheduler; a request
cancelled while `execute` runs is marked in the worker (`request.is_cancelled()`), and once all
are, the execute's BLS calls are cancelled (`python_bls` says when else they are).

Isolation:

* `execute` raises, or returns a response with an error: that request fails with BackendError
  (the exception's type and message); the worker and the model stay up.
* `execute` gives no answer within `execute_timeout_seconds` (config parameter, default 30): the
  worker is killed by its PID; a worker exits or is killed: ModelInstanceFailedError with the
  reason. From then on every call fails with that reason; the data plane takes the version out
  of service (`ModelRegistry.mark_failed`).
* `initialize` raises, or the file has no `TritonPythonModel`: ModelLoadError naming the file.

Lifetime: see `agent.backends.python_process`. `close()` calls `finalize` (bounded by
`finalize_timeout_seconds`, default 5), then ends each worker by PID. Config parameters and
declared tensors: `agent.backends.python_config`.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

from agent.backends import python_ipc as ipc
from agent.backends.cancellation import CancelSignal
from agent.backends.custom_metrics import CustomMetricStore
from agent.backends.python_bls import BlsCalls, BlsRunner
from agent.backends.python_bls_relay import BlsRelay
from agent.backends.python_config import (
    DEFAULT_MODEL_FILENAME,
    PYTHON_BACKEND,
    tensors_from_config,
    timeouts_from_config,
)
from agent.backends.python_process import Launcher, Worker, kill_worker, reap_worker
from agent.backends.python_stream import DecoupledChannel, DecoupledRequest
from agent.errors import (
    AgentError,
    BackendError,
    ModelConfigError,
    ModelInstanceFailedError,
    ModelLoadError,
)
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import complete_config
from agent.repository.model_config import config_from_json, config_to_json
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor

logger = logging.getLogger(__name__)

# pb_utils.Logger levels → the agent's log levels (Triton's VERBOSE is our DEBUG).
_LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}


# args["model_instance_kind"] as Triton passes it (KIND_AUTO is resolved before this).
_INSTANCE_KINDS = {mc.ModelInstanceGroup.KIND_GPU: "GPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}


class PythonBackend:
    """A Python model version: its worker processes and the config's tensors."""

    def __init__(
        self,
        version_dir: Path,
        config: mc.ModelConfig,
        *,
        model_name: str = "",
        version: int = 0,
        auto_complete: bool = True,
        custom_metrics: CustomMetricStore | None = None,
        bls: BlsRunner | None = None,
    ) -> None:
        """Start one worker per instance and run `initialize` in each.

        `bls` runs the BLS requests the model makes from `execute` (`agent.backends.python_bls`);
        without it they fail with an error response.

        Raises:
            ModelConfigError: inputs/outputs missing from the config, or a bad timeout parameter.
            ModelLoadError: no model file, or a worker failed to start, import it or initialize.
        """
        self.name = model_name or config.name or version_dir.parent.name
        self.version = version or (int(version_dir.name) if version_dir.name.isdigit() else 0)
        self.timeouts = timeouts_from_config(config)
        self.model_file = version_dir / (config.default_model_filename or DEFAULT_MODEL_FILENAME)
        if not self.model_file.is_file():
            raise ModelLoadError(
                f"python model '{self.name}' version {self.version}: {self.model_file} not found"
            )
        self._bls = bls
        self._executes = itertools.count()  # sequence numbers of EXECUTE, which CANCEL names
        self._failure: str | None = None
        self._custom_metrics = custom_metrics
        self._lock = threading.Lock()
        self._closed = False
        self._workers: list[Worker] = []
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._channels: dict[int, DecoupledChannel] = {}  # decoupled models: per worker
        self._request_ids = itertools.count(1)
        self._launcher = Launcher(f"{self.name}-{self.version}")
        try:
            # As Triton: the model's auto_complete_config runs before the config is final; the
            # loader completes from `declared_config`, what it returned.
            if auto_complete:
                config = self._auto_complete(config)
            self.declared_config = config
            self._inputs, self._outputs = tensors_from_config(config, self.name)
            self._declared = {t.name: t for t in self._outputs}
            self._batched = config.max_batch_size > 0
            self.decoupled = config.model_transaction_policy.decoupled
            completed = complete_config(
                config, self.name, self._inputs, self._outputs, auto_complete=True
            )
            self._start_workers(completed, version_dir.parent)
        except BaseException:
            self.close()
            raise
        for worker in self._workers:
            if self.decoupled:
                self._channels[worker.index] = self._channel(worker)
            self._idle.put(worker)

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return self._outputs

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """PIDs of the worker processes, instance order."""
        return tuple(w.process.pid for w in self._workers)

    @property
    def worker_rss_bytes(self) -> int:
        """Resident memory of the live workers (0 where /proc is not readable)."""
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for worker in self._workers:
            try:
                fields = Path(f"/proc/{worker.process.pid}/statm").read_text().split()
            except OSError:
                continue
            total += int(fields[1]) * page
        return total

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,  # nothing to shrink in this process
    ) -> list[np.ndarray]:
        """Run one request (or a merged batch) on a free worker.

        Raises:
            BackendError: `execute` raised, reported an error or returned unusable outputs.
            ModelInstanceFailedError: the worker hung (and was killed) or died, now or before.
        """
        answer = self.run_requests([(feeds, output_names)])[0]
        if isinstance(answer, AgentError):
            raise answer
        return answer

    def run_requests(
        self,
        requests: Sequence[tuple[Mapping[str, np.ndarray], Sequence[str]]],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
    ) -> list[list[np.ndarray] | AgentError]:
        """Run the requests of one dynamic batch in ONE `execute` call, each its own
        `InferenceRequest` (Triton's Python backend semantics); the scheduler calls this instead
        of merging them. Each answer is that request's outputs, or its error (BackendError).
        `traces`: each request's trace (None: untraced), the parent of the BLS requests that
        `execute` makes with `trace=request.trace()`.

        `cancelled` holds one signal per request (or none): a request cancelled while `execute`
        runs reads `is_cancelled()` True in the model; once all are, the execute's BLS calls
        are cancelled too.

        Raises:
            BackendError: `execute` raised or returned a wrong number of responses (every
                request of the batch fails).
            ModelInstanceFailedError: the worker hung (and was killed) or died, now or before.
        """
        if self._failure is not None:
            raise ModelInstanceFailedError(self._failure)
        worker = self._idle.get()
        try:
            return self._run_on(worker, requests, cancelled, traces)
        finally:
            self._idle.put(worker)

    def run_decoupled(self, requests: Sequence[DecoupledRequest]) -> None:
        """Run the requests of one batch in ONE `execute` call of a decoupled model; returns
        when `execute` returned (the instance is free again). Each request's responses go to its
        sink as the model sends them, until its final flag, also after this returned; every
        failure reaches the sinks as an error response with the final flag.

        Raises:
            ModelInstanceFailedError: the worker hung (and was killed) or died, now or before.
        """
        if self._failure is not None:
            raise ModelInstanceFailedError(self._failure)
        worker = self._idle.get()
        try:
            self._run_decoupled_on(worker, requests)
        finally:
            self._idle.put(worker)

    def _run_decoupled_on(
        self,
        worker: Worker,
        requests: Sequence[DecoupledRequest],
    ) -> None:
        channel = self._channels[worker.index]
        ids = [next(self._request_ids) for _ in requests]
        try:
            reply = channel.execute(list(zip(ids, requests, strict=True)), self.timeouts.execute_s)
        except TimeoutError:
            kill_worker(worker)
            self._fail(
                f"python model '{self.name}' instance {worker.index} hung: no response within "
                f"{self.timeouts.execute_s:g} s; worker killed"
            )
        except (EOFError, OSError, ipc.WireError):
            self._fail(
                f"python model '{self.name}' instance {worker.index} {self._exit_reason(worker)}"
            )
        if reply.kind == ipc.ERROR:
            error = BackendError(
                f"python model '{self.name}' execute failed: {reply.meta.get('message', '')}"
            )
            channel.fail_all(error, ids)

    def _channel(self, worker: Worker) -> DecoupledChannel:
        relay: list[BlsRelay] = []  # made once the channel (its sender) exists

        def side_message(message: ipc.Message) -> bool:
            if message.kind in (ipc.BLS, ipc.BLS_CANCEL) and relay:
                relay[0].handle(message)  # at any time, as Triton allows
                return True
            return self._side_message(worker, message)

        def check(names: Sequence[str], returned: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [self._checked(n, returned.get(n), None) for n in names]

        def exit_reason() -> str:
            return f"python model '{self.name}' instance {worker.index} {self._exit_reason(worker)}"

        channel = DecoupledChannel(
            worker.conn, f"{self.name}-{worker.name}", side_message, check, exit_reason
        )
        relay.append(BlsRelay(self._bls, channel.send))
        return channel

    def _send(self, worker: Worker, message: ipc.Message) -> None:
        channel = self._channels.get(worker.index)
        if channel is not None:
            channel.send(message)
        else:
            ipc.send(worker.conn, message)

    def close(self) -> None:
        """Finalize every live worker (bounded), then end each process by PID. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for open_channel in self._channels.values():
            open_channel.closing = True
        asked = []
        for worker in self._workers:
            if worker.ready and worker.process.poll() is None:
                try:
                    self._send(worker, ipc.Message(ipc.FINALIZE))
                    asked.append(worker)
                except OSError:
                    pass
        deadline = time.monotonic() + self.timeouts.finalize_s
        finalized = set()
        for worker in asked:
            try:
                self._receive(worker, deadline)
                finalized.add(worker.index)
            except (TimeoutError, EOFError, OSError, ipc.WireError):
                logger.warning(
                    "python model %s instance %d: finalize did not finish within %g s",
                    self.name,
                    worker.index,
                    self.timeouts.finalize_s,
                    extra={"model": self.name, "version": self.version},
                )
        for worker in self._workers:
            channel = self._channels.get(worker.index)
            if channel is None:
                worker.conn.close()
            if self._custom_metrics is not None:  # its series go with it, as in Triton
                self._custom_metrics.release(self._metrics_source(worker))
            if worker.index in finalized:
                reap_worker(worker)  # it exits by itself after FINALIZED; SIGKILL if it lingers
            else:
                kill_worker(worker)  # not initialized, stuck in finalize, or already gone
            if channel is not None:  # its reader thread sees EOF now; then the pipe closes
                channel.join()
                worker.conn.close()
        self._launcher.stop()

    def _auto_complete(self, config: mc.ModelConfig) -> mc.ModelConfig:
        """The config after the model's `auto_complete_config`, run in a worker of its own.

        Raises:
            ModelLoadError: the file does not import, auto_complete_config raised (Triton's
                ValueError wording for a contradiction with config.pbtxt) or returned no
                ModelConfig, or the worker hung or died.
        """
        named = mc.ModelConfig()
        named.CopyFrom(config)
        named.name = named.name or self.name
        named.backend = named.backend or PYTHON_BACKEND
        meta = {
            "model_file": str(self.model_file),
            "config": json.dumps(config_to_json(named)),
            "model_name": self.name,
        }
        worker = self._spawn(-1, "auto-complete")
        where = f"python model '{self.name}' version {self.version}: {self.model_file}"
        where += ": auto-complete"
        try:
            ipc.send(worker.conn, ipc.Message(ipc.AUTOCOMPLETE, meta))
            reply = self._receive(worker, time.monotonic() + self.timeouts.initialize_s)
        except TimeoutError:
            kill_worker(worker)
            raise ModelLoadError(
                f"{where} gave no answer within {self.timeouts.initialize_s:g} s"
            ) from None
        except (EOFError, OSError, ipc.WireError):
            raise ModelLoadError(f"{where}: {self._exit_reason(worker)}") from None
        finally:
            worker.conn.close()
            if self._custom_metrics is not None:
                self._custom_metrics.release(self._metrics_source(worker))
        reap_worker(worker)  # it exits after answering
        if reply.kind != ipc.COMPLETED:
            raise ModelLoadError(f"{where} failed: {reply.meta.get('message', reply.kind)}")
        try:
            return config_from_json(json.loads(str(reply.meta["config"])))
        except (ValueError, ModelConfigError) as exc:
            text = exc.message if isinstance(exc, ModelConfigError) else str(exc)
            raise ModelLoadError(f"{where} returned an invalid config: {text}") from None

    def _receive(self, worker: Worker, deadline: float | None) -> ipc.Message:
        """The worker's next answer; the `pb_utils.Logger` lines before it go to the agent's log.

        Raises:
            TimeoutError, EOFError, OSError, ipc.WireError: as `ipc.receive`.
        """
        channel = self._channels.get(worker.index)
        if channel is not None:  # its reader thread has the pipe
            return channel.receive(deadline)
        while True:
            message = self._receive_one(worker, deadline)
            if message is not None:
                return message

    def _receive_one(self, worker: Worker, deadline: float | None) -> ipc.Message | None:
        """The worker's next message; None when it was a log line, metrics or a metric query
        (handled here).

        Raises:
            TimeoutError, EOFError, OSError, ipc.WireError: as `ipc.receive`.
        """
        message = ipc.receive(worker.conn, deadline)
        return None if self._side_message(worker, message) else message

    def _side_message(self, worker: Worker, message: ipc.Message) -> bool:
        """Handle a LOG, METRICS or METRIC_VALUE message (True); any other is for the caller."""
        if message.kind == ipc.METRICS:
            self._apply_metrics(worker, message)
        elif message.kind == ipc.METRIC_VALUE:
            self._answer_metric_value(worker, message)
        elif message.kind != ipc.LOG:
            return False
        else:
            meta = message.meta
            logger.log(
                _LOG_LEVELS.get(str(meta.get("level")), logging.INFO),
                "python model %s (%s, %s:%s): %s",
                self.name,
                worker.name,
                os.path.basename(str(meta.get("file", ""))),
                meta.get("line", 0),
                meta.get("message", ""),
                extra={"model": self.name, "version": self.version},
            )
        return True

    def _metrics_source(self, worker: Worker) -> str:
        return f"{self.name}/{self.version}/{worker.name}/{worker.process.pid}"

    def _apply_metrics(self, worker: Worker, message: ipc.Message) -> None:
        """Custom metrics (pb_utils.MetricFamily) from a worker go to the agent's store."""
        if self._custom_metrics is None:
            return
        for problem in self._custom_metrics.apply(self._metrics_source(worker), message.meta):
            logger.warning(
                "python model %s (%s): %s",
                self.name,
                worker.name,
                problem,
                extra={"model": self.name, "version": self.version},
            )

    def _answer_metric_value(self, worker: Worker, message: ipc.Message) -> None:
        """`Metric.value()` in a worker: the total of every instance, from the agent's store."""
        meta = message.meta
        value = None
        labels = meta.get("labels")
        if self._custom_metrics is not None and isinstance(labels, dict):
            value = self._custom_metrics.value(str(meta.get("family", "")), labels)
        reply = {"id": meta.get("id"), "value": value}
        self._send(worker, ipc.Message(ipc.METRIC_VALUE_RESULT, reply))

    def _start_workers(self, config: mc.ModelConfig, model_dir: Path) -> None:
        config_json = json.dumps(config_to_json(config))
        pending = []
        for group in config.instance_group:
            gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
            for i in range(max(1, group.count)):
                index = len(self._workers)
                device = group.gpus[i % len(group.gpus)] if gpu and group.gpus else 0
                args = {
                    "model_config": config_json,
                    "model_instance_kind": _INSTANCE_KINDS.get(group.kind, "CPU"),
                    "model_instance_name": f"{group.name}_{i}",
                    "model_instance_device_id": str(device),
                    "model_repository": str(model_dir),
                    "model_version": str(self.version),
                    "model_name": self.name,
                }
                worker = self._spawn(index, args["model_instance_name"])
                self._workers.append(worker)
                pending.append((worker, args))
        # Interpreters start in parallel; then each imports the model and initializes.
        for worker, args in pending:
            meta = {"model_file": str(self.model_file), "args": args}
            try:
                ipc.send(worker.conn, ipc.Message(ipc.INIT, meta))
            except OSError:
                raise self._load_error(worker, self._exit_reason(worker)) from None
        deadline = time.monotonic() + self.timeouts.initialize_s
        for worker, _ in pending:
            try:
                reply = self._receive(worker, deadline)
            except TimeoutError:
                kill_worker(worker)
                raise self._load_error(
                    worker, f"initialize gave no answer within {self.timeouts.initialize_s:g} s"
                ) from None
            except (EOFError, OSError, ipc.WireError):
                raise self._load_error(worker, self._exit_reason(worker)) from None
            if reply.kind != ipc.READY:
                raise self._load_error(worker, str(reply.meta.get("message", reply.kind)))
            worker.ready = True
        logger.info(
            "python model %s version %d: %d worker(s), pids %s",
            self.name,
            self.version,
            len(self._workers),
            list(self.worker_pids),
            extra={"model": self.name, "version": self.version},
        )

    def _spawn(self, index: int, instance_name: str) -> Worker:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        argv = [
            sys.executable,
            "-m",
            "agent.backends.python_worker",
            str(theirs.fileno()),
            str(os.getpid()),
        ]
        try:
            process = self._launcher.start(argv, theirs.fileno())
        except OSError as exc:
            ours.close()
            raise ModelLoadError(
                f"python model '{self.name}': cannot start a worker: {exc}"
            ) from None
        finally:
            theirs.close()  # the worker holds its own copy; EOF then means the worker is gone
        return Worker(index, instance_name, process, ours)

    def _load_error(self, worker: Worker, reason: str) -> ModelLoadError:
        return ModelLoadError(
            f"python model '{self.name}' version {self.version} instance {worker.index}: "
            f"{self.model_file}: {reason}"
        )

    def _run_on(
        self,
        worker: Worker,
        requests: Sequence[tuple[Mapping[str, np.ndarray], Sequence[str]]],
        cancelled: Sequence[CancelSignal],
        traces: Sequence[object | None] = (),
    ) -> list[list[np.ndarray] | AgentError]:
        if self._failure is not None:
            raise ModelInstanceFailedError(self._failure)
        described: list[dict[str, object]] = [
            {"outputs": list(names), "inputs": len(feeds)} for feeds, names in requests
        ]
        for index, trace in enumerate(traces):
            if trace is not None:  # the worker's `request.trace()` names it by this index
                described[index]["trace"] = index
        tensors = [item for feeds, _ in requests for item in feeds.items()]
        seq = next(self._executes)
        message = ipc.Message(ipc.EXECUTE, {"requests": described, "seq": seq}, tensors)
        calls = BlsCalls(self._bls, worker.conn, self.timeouts.execute_s, self.name, traces)
        calls.watch(seq, cancelled)
        try:
            ipc.send(worker.conn, message)
            # The worker's own time counts: the clock restarts when its BLS calls are answered.
            deadline = time.monotonic() + self.timeouts.execute_s
            while True:
                busy = calls.busy
                calls.wait(deadline)
                if busy:
                    deadline = time.monotonic() + self.timeouts.execute_s
                calls.tell_cancelled()
                if not worker.conn.poll(0):
                    if not calls.busy and time.monotonic() >= deadline:
                        raise TimeoutError
                    continue
                reply = self._receive_one(worker, deadline)
                if reply is None:  # a log line: BLS results must keep flowing meanwhile
                    continue
                if reply.kind == ipc.BLS:
                    calls.start(reply)
                elif reply.kind == ipc.BLS_CANCEL:
                    calls.drop(reply)
                else:
                    break
        except TimeoutError:
            kill_worker(worker)
            self._fail(
                f"python model '{self.name}' instance {worker.index} hung: no response within "
                f"{self.timeouts.execute_s:g} s; worker killed"
            )
        except (EOFError, OSError, ipc.WireError):
            self._fail(
                f"python model '{self.name}' instance {worker.index} {self._exit_reason(worker)}"
            )
        finally:
            calls.cancel()  # calls still running (abandoned, or the worker died) are cancelled
        if reply.kind == ipc.ERROR:
            raise BackendError(
                f"python model '{self.name}' execute failed: {reply.meta.get('message', '')}"
            )
        answers = reply.meta.get("responses")
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise BackendError(f"python model '{self.name}': malformed answer from the worker")
        results: list[list[np.ndarray] | AgentError] = []
        offset = 0
        for (feeds, names), answer in zip(requests, answers, strict=True):
            count = int(answer.get("tensors", 0))
            returned = dict(reply.tensors[offset : offset + count])
            offset += count
            if "error" in answer:
                results.append(
                    BackendError(f"python model '{self.name}' execute failed: {answer['error']}")
                )
                continue
            rows = next(iter(feeds.values())).shape[0] if self._batched and feeds else None
            try:
                results.append([self._checked(n, returned.get(n), rows) for n in names])
            except BackendError as exc:
                results.append(exc)
        return results

    def _checked(self, name: str, array: np.ndarray | None, rows: int | None) -> np.ndarray:
        where = f"python model '{self.name}' output '{name}'"
        if array is None:
            raise BackendError(f"{where}: execute returned no tensor of that name")
        declared = self._declared[name]
        assert declared.datatype is not None
        got = "BYTES" if array.dtype == np.object_ else _kserve(array.dtype)
        if got != declared.datatype.kserve:
            raise BackendError(
                f"{where} is {got} but the config says {declared.type_name} "
                "(convert it with .astype before returning it)"
            )
        shape = declared.shape
        fits = len(array.shape) == len(shape) and all(
            want is None or want == have for want, have in zip(shape, array.shape, strict=True)
        )
        if not fits or (rows is not None and array.shape[0] != rows):
            expected = ["-1" if d is None else str(d) for d in shape]
            if rows is not None:
                expected[0] = str(rows)
            raise BackendError(
                f"{where} has shape {list(array.shape)}, expected [{', '.join(expected)}]"
            )
        return array

    def _fail(self, reason: str) -> NoReturn:
        """Remember the first failure, then raise ModelInstanceFailedError with it."""
        with self._lock:
            if self._failure is None:
                self._failure = reason
                logger.error("%s", reason, extra={"model": self.name, "version": self.version})
        raise ModelInstanceFailedError(reason)

    def _exit_reason(self, worker: Worker) -> str:
        code = reap_worker(worker)
        if code < 0:
            return f"worker (pid {worker.process.pid}) killed by signal {-code}"
        return f"worker (pid {worker.process.pid}) exited with code {code}"


def _kserve(dtype: np.dtype) -> str:
    for kind in datatypes.BY_KSERVE.values():
        if kind.numpy == dtype:
            return kind.kserve
    return str(dtype)
