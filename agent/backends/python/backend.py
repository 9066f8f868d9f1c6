"""Python backend (`backend: "python"`): user code in one worker process per model instance.

A version folder holds `model.py` (or the config's `default_model_filename`) defining
`TritonPythonModel` (see `agent.pb_utils`). Inputs and outputs come from config.pbtxt, which must
declare them, or from the model's `auto_complete_config`: there is no model file to read them from.

Auto-complete: as Triton's auto-complete stub, one short-lived worker imports the file and runs
`TritonPythonModel.auto_complete_config` on the config (as JSON) before any instance starts; its
errors fail the load with the model's message (`agent.backends.python.autocomplete`). Its result
is `declared_config`, which the loader completes and serves (`agent.models.loader`).

Processes: an instance group count of N starts N workers (`python -m
agent.backends.python.worker.main`, a fresh interpreter: never a fork of the threaded agent;
`agent.backends.python.instances`). The scheduler runs at most N batches at once; each batch
takes a free worker, which passes its requests to ONE `execute` call, each its own
`InferenceRequest` (as Triton's Python backend does: `run_requests`, which the scheduler calls
instead of merging the batch), and waits for their responses: from the event loop without a
thread when it can (`start_requests`, `agent.backends.python.on_loop`), else on an executor
thread. Tensors travel over a socketpair as raw buffers (`agent.backends.python.ipc` says why
not shared memory).

Log lines, custom metrics and metric queries a worker sends at any time are handled by
`agent.backends.python.side_messages`; returned outputs are checked against the config by
`agent.backends.python.outputs`.

BLS: while it waits for an `execute` answer, the backend runs the model's BLS requests through
the `bls` callable it was given (the data plane, `agent.backends.python.bls`).

Cancellation: `run_requests` takes one `CancelSignal` per request from the scheduler; a request
cancelled while `execute` runs is marked in the worker (`request.is_cancelled()`), and once all
are, the execute's BLS calls are cancelled (`python_bls` says when else they are).

Isolation and health (`agent.backends.python.supervisor`, docs/operations.md):

* `execute` raises, or returns a response with an error: that request fails with BackendError
  (the exception's type and message); the worker and the model stay up.
* A worker's process ends (it exits, is killed, by the OOM killer or anyone), stops answering
  its heartbeat, or gives no answer to an `execute` within `execute_timeout_seconds` (config
  parameter, default 30; it is then killed by its PID): the requests it was running fail with
  ModelInstanceFailedError and the reason; its instance is DOWN at once and is started again
  after a back-off (initialize runs again). Requests meanwhile go to the other instances, or
  wait for one (at most `execute_timeout_seconds`). The version is not ready while no instance
  is UP; after `restart_limit` restarts in a row it gives up (UNAVAILABLE, with the reason).
* `initialize` raises at load, or the file has no `TritonPythonModel`: ModelLoadError naming the
  file.

Lifetime: see `agent.backends.python.process`. `close()` calls `finalize` (bounded by
`finalize_timeout_seconds`, default 5), then ends each worker by PID. Config parameters and
declared tensors: `agent.backends.python.config`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import NoReturn

import numpy as np

from agent.backends.base import (
    Backend,
    DeclaresConfig,
    DecoupledRequest,
    HoldsWorkerMemory,
    ModelOutputs,
    NamedOutputs,
    ReportsHealth,
    RequestFeeds,
    RunsDecoupled,
    RunsRequests,
)
from agent.backends.cancellation import CancelSignal
from agent.backends.health import HealthListener, HealthState, RestartPolicy, VersionHealth
from agent.backends.python import ipc
from agent.backends.python.autocomplete import auto_complete_in_worker
from agent.backends.python.bls import BlsCalls, BlsRunner
from agent.backends.python.bls_relay import BlsRelay
from agent.backends.python.config import (
    DEFAULT_MODEL_FILENAME,
    tensors_from_config,
    timeouts_from_config,
)
from agent.backends.python.custom_metrics import CustomMetricStore
from agent.backends.python.instances import (
    WorkerSite,
    instance_args,
    restart_worker,
    start_workers,
)
from agent.backends.python.model_errors import raised_error, reported_error
from agent.backends.python.on_loop import LoopCall
from agent.backends.python.outputs import in_requested_order, requested_outputs
from agent.backends.python.pool import WorkerPool
from agent.backends.python.process import Launcher, Worker, exit_reason, kill_worker, reap_worker
from agent.backends.python.side_messages import SideMessages
from agent.backends.python.stream import DecoupledChannel, NotSent
from agent.backends.python.supervisor import Supervisor, WorkerHooks
from agent.errors import AgentError, BackendError, ModelInstanceFailedError, ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import complete_config
from agent.tensors.datatypes import ModelTensor
from agent.tensors.request import RequestContext

logger = logging.getLogger(__name__)


_PING_WAIT_S = 0.05  # a PING waits this long for a blocked pipe, then the next round tries
# EXECUTE up to this size is sent from the event loop (`start_requests`): far less than a socket
# buffer, so the write never waits for the worker.
_LOOP_FRAME_BYTES = 64 * 1024


class PythonBackend(
    Backend, RunsRequests, RunsDecoupled, DeclaresConfig, HoldsWorkerMemory, ReportsHealth
):
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
        restart_policy: RestartPolicy | None = None,
        health_listener: HealthListener | None = None,
    ) -> None:
        """Start one worker per instance and run `initialize` in each; then supervise them.

        `bls` runs the BLS requests the model makes from `execute` (`agent.backends.python.bls`);
        without it they fail with an error response. `restart_policy`: when failed workers are
        started again (default: `RestartPolicy()`); `health_listener` hears each change.

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
        self._side = SideMessages(self.name, self.version, custom_metrics, self._send)
        self._lock = threading.Lock()
        self._closed = False
        self._label = f"python model '{self.name}' version {self.version}"
        self._workers: list[Worker] = []  # at load; then the supervisor keeps the current ones
        self._args: list[dict[str, str]] = []  # each instance's `initialize` args
        self._pool = WorkerPool(self._label)
        self._channels: dict[Worker, DecoupledChannel] = {}  # decoupled models: per worker
        self._request_ids = itertools.count(1)
        self._launcher = Launcher(f"{self.name}-{self.version}")
        self._supervisor: Supervisor | None = None
        self._site = site = WorkerSite(
            self.name, self.version, self.model_file, self.timeouts, self._launcher, self._side
        )
        policy = restart_policy or RestartPolicy()
        try:
            # As Triton: the model's auto_complete_config runs before the config is final; the
            # loader completes from `declared_config`, what it returned.
            if auto_complete:
                config = auto_complete_in_worker(site, config)
            self.declared_config = config
            self._inputs, self._outputs = tensors_from_config(config, self.name)
            self._declared = {t.name: t for t in self._outputs}
            self._batched = config.max_batch_size > 0
            self.decoupled = config.model_transaction_policy.decoupled
            completed = complete_config(
                config, self.name, self._inputs, self._outputs, auto_complete=True
            )
            self._args = instance_args(site, completed, version_dir.parent)
            start_workers(site, self._args, self._workers)
        except BaseException:
            self.close()
            raise
        for worker in self._workers:
            if self.decoupled:
                self._channels[worker] = self._channel(worker)
            self._pool.put(worker)
        health = VersionHealth([w.name for w in self._workers], policy, time.monotonic())
        hooks = WorkerHooks(
            restart=self._restart,
            ended=self._worker_ended,
            ping=lambda worker, message: worker.try_send(message, _PING_WAIT_S),
            read_idle=None if self.decoupled else self._side.receive_one,
        )
        self._supervisor = Supervisor(
            self._label,
            self._workers,
            self._pool,
            health,
            hooks,
            heartbeat_timeout_s=self.timeouts.heartbeat_s or policy.heartbeat_timeout_s,
            listener=health_listener,
            extra={"model": self.name, "version": self.version},
        )
        self._supervisor.start()

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return self._outputs

    @property
    def health(self) -> HealthState:
        """Which instances serve now (`agent.backends.health`)."""
        assert self._supervisor is not None  # made when the load succeeded
        return self._supervisor.state

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """PIDs of the current worker processes, instance order (a DOWN instance has none)."""
        return tuple(w.process.pid for w in self._current())

    def _current(self) -> list[Worker]:
        return self._supervisor.workers() if self._supervisor is not None else self._workers

    @property
    def worker_rss_bytes(self) -> int:
        """Resident memory of the live workers (0 where /proc is not readable)."""
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for worker in self._current():
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
        return in_requested_order(self.name, answer, output_names)

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        """Run the requests of one dynamic batch in ONE `execute` call, each its own
        `InferenceRequest` (Triton's Python backend semantics); the scheduler calls this instead
        of merging them. Each answer is that request's outputs (those requested that the model
        returned, in the model's order), or its error (BackendError).
        `traces`: each request's trace (None: untraced), the parent of the BLS requests that
        `execute` makes with `trace=request.trace()`. `contexts`: what each request's
        `request_id()`, `parameters()` and `correlation_id()` answer.

        `cancelled` holds one signal per request (or none): a request cancelled while `execute`
        runs reads `is_cancelled()` True in the model; once all are, the execute's BLS calls
        are cancelled too.

        Raises:
            BackendError: `execute` raised or returned a wrong number of responses (every
                request of the batch fails).
            ModelInstanceFailedError: the worker hung (and was killed) or died while it ran
                them.
            ModelNotReadyError: no instance could take them within `execute_timeout_seconds`
                (every instance restarting), or the version gave up.
        """
        for _ in range(len(self._args) + 1):
            worker = self._pool.take(self.timeouts.execute_s)
            try:
                return self._run_on(worker, requests, cancelled, traces, contexts)
            except _NotTaken:
                continue  # it was gone before the requests reached it: they go to another
            finally:
                self._give_back(worker)
        raise ModelInstanceFailedError(f"{self._label}: every instance failed before it ran")

    def start_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
        executor: Executor,
    ) -> asyncio.Future[list[NamedOutputs | AgentError]] | None:
        """`run_requests` from the event loop, without blocking it: EXECUTE goes out at once
        to an idle worker, and the answer is read on the loop (`agent.backends.python.on_loop`;
        a thread of `executor` takes over for BLS calls, large answers and failures). None
        when that is not possible now (no idle worker, large inputs, a decoupled model): call
        `run_requests` on a thread instead. The future fails as `run_requests` raises.
        """
        if self.decoupled or self._closed:
            return None
        seq, message = self._execute_message(requests, traces, contexts)
        frame = ipc.encode(message)  # raises as `run_requests` would: the caller falls back
        if ipc.frame_size(frame) > _LOOP_FRAME_BYTES:
            return None  # its write could wait for the worker to read: a thread sends it
        worker = self._pool.take_now()
        if worker is None:
            return None
        try:
            worker.send_frame(frame)
        except OSError:
            self._pool.discard(worker)  # dead before it took them: a thread tries another
            self._give_back(worker)
            return None

        def finish(reply: ipc.Message) -> list[NamedOutputs | AgentError]:
            try:
                return self._answers(worker, reply, requests)
            finally:
                self._give_back(worker)

        def handoff(
            pending: Callable[[], ipc.Message] | None, deadline: float
        ) -> list[NamedOutputs | AgentError]:
            try:
                reply = self._await_reply(worker, seq, cancelled, traces, pending, deadline)
                return self._answers(worker, reply, requests)
            finally:
                self._give_back(worker)

        loop = asyncio.get_running_loop()
        try:
            call = LoopCall(
                loop,
                executor,
                worker.conn,
                worker.send,
                seq,
                cancelled,
                self.timeouts.execute_s,
                lambda message: self._side.handle(worker, message),
                finish,
                handoff,
            )
        except Exception:  # noqa: BLE001 - EXECUTE is out: a thread must see it through
            deadline = time.monotonic() + self.timeouts.execute_s
            return loop.run_in_executor(executor, handoff, None, deadline)
        return call.future

    def run_decoupled(
        self,
        requests: Sequence[DecoupledRequest],
        *,
        contexts: Sequence[RequestContext | None] = (),
    ) -> None:
        """Run the requests of one batch in ONE `execute` call of a decoupled model; returns
        when `execute` returned (the instance is free again). Each request's responses go to its
        sink as the model sends them, until its final flag, also after this returned; every
        failure reaches the sinks as an error response with the final flag.

        Raises:
            ModelInstanceFailedError: the worker hung (and was killed) or died.
            ModelNotReadyError: as `run_requests`.
        """
        for _ in range(len(self._args) + 1):
            worker = self._pool.take(self.timeouts.execute_s)
            try:
                self._run_decoupled_on(worker, requests, contexts)
                return
            except _NotTaken:
                continue  # it was gone before the requests reached it: they go to another
            finally:
                self._give_back(worker)
        raise ModelInstanceFailedError(f"{self._label}: every instance failed before it ran")

    def _give_back(self, worker: Worker) -> None:
        if not self._pool.give_back(worker):  # its process ended while it ran: pipe closed here
            self._close_pipe(worker)

    def _run_decoupled_on(
        self,
        worker: Worker,
        requests: Sequence[DecoupledRequest],
        contexts: Sequence[RequestContext | None] = (),
    ) -> None:
        channel = self._channels[worker]
        ids = [next(self._request_ids) for _ in requests]
        try:
            reply = channel.execute(
                list(zip(ids, requests, strict=True)), self.timeouts.execute_s, contexts
            )
        except NotSent:
            self._pool.discard(worker)
            raise _NotTaken from None
        except TimeoutError:
            self._hung(worker)
        except (EOFError, OSError, ipc.WireError):
            raise ModelInstanceFailedError(self._ended(worker)) from None
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
            return self._side.handle(worker, message)

        def check(names: Sequence[str], returned: dict[str, np.ndarray]) -> NamedOutputs:
            return requested_outputs(self.name, self._declared, names, returned, None)

        channel = DecoupledChannel(
            worker.conn,
            f"{self.name}-{worker.name}",
            side_message,
            check,
            lambda: self._ended(worker),
            worker.send,
        )
        relay.append(BlsRelay(self._bls, channel.send))
        return channel

    def _send(self, worker: Worker, message: ipc.Message) -> None:
        worker.send(message)

    def _restart(self, index: int) -> Worker:
        """The supervisor's: start instance `index` again (blocking; raises ModelLoadError)."""
        worker = restart_worker(self._site, self._args[index], index)
        if self.decoupled:
            self._channels[worker] = self._channel(worker)
        return worker

    def _worker_ended(self, worker: Worker, owned: bool) -> None:
        """The supervisor's: a worker's process ended; `owned`: nobody holds it (close it
        here), else the execution holding it closes it when it gives it back."""
        self._side.release(worker)  # its series go with it, as in Triton
        if owned:
            self._close_pipe(worker)

    def _close_pipe(self, worker: Worker) -> None:
        channel = self._channels.pop(worker, None)
        if channel is not None:  # its reader thread has seen EOF (or sees it now)
            channel.join()
        worker.close()

    def close(self) -> None:
        """Stop the supervision, finalize every live worker (bounded), then end each process by
        PID. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._supervisor is not None:
            self._supervisor.stop()  # a restart finishing after this ends its own worker
        workers = self._current()
        self._pool.fail(f"{self._label} was unloaded")
        for open_channel in self._channels.values():
            open_channel.closing = True
        asked = []
        for worker in workers:
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
                while self._receive(worker, deadline).kind != ipc.FINALIZED:
                    pass  # a stray answer before it (a late RESULT is impossible: none runs)
                finalized.add(worker)
            except (TimeoutError, EOFError, OSError, ipc.WireError):
                logger.warning(
                    "python model %s instance %d: finalize did not finish within %g s",
                    self.name,
                    worker.index,
                    self.timeouts.finalize_s,
                    extra={"model": self.name, "version": self.version},
                )
        for worker in workers:
            self._side.release(worker)  # its series go with it, as in Triton
            if worker in finalized:
                reap_worker(worker)  # it exits by itself after FINALIZED; SIGKILL if it lingers
            else:
                kill_worker(worker)  # not initialized, stuck in finalize, or already gone
            self._close_pipe(worker)  # a decoupled reader thread has seen EOF by now
        self._launcher.stop()

    def _receive(self, worker: Worker, deadline: float | None) -> ipc.Message:
        """The worker's next answer; the `pb_utils.Logger` lines before it go to the agent's log.

        Raises:
            TimeoutError, EOFError, OSError, ipc.WireError: as `ipc.receive`.
        """
        channel = self._channels.get(worker)
        if channel is not None:  # its reader thread has the pipe
            return channel.receive(deadline)
        return self._side.receive(worker, deadline)

    def _run_on(
        self,
        worker: Worker,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal],
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        seq, message = self._execute_message(requests, traces, contexts)
        try:
            worker.send(message)
        except OSError:
            self._pool.discard(worker)  # dead before it took them: the caller tries another
            raise _NotTaken from None
        deadline = time.monotonic() + self.timeouts.execute_s
        reply = self._await_reply(worker, seq, cancelled, traces, None, deadline)
        return self._answers(worker, reply, requests)

    def _execute_message(
        self,
        requests: Sequence[RequestFeeds],
        traces: Sequence[object | None],
        contexts: Sequence[RequestContext | None] = (),
    ) -> tuple[int, ipc.Message]:
        """EXECUTE for a batch, and its sequence number (which CANCEL names)."""
        described: list[dict[str, object]] = []
        tensors: list[tuple[str, np.ndarray]] = []
        for index, (feeds, names) in enumerate(requests):  # one pass: every call
            item: dict[str, object] = {"outputs": list(names), "inputs": len(feeds)}
            if index < len(traces) and traces[index] is not None:
                item["trace"] = index  # the worker's `request.trace()` names it by this index
            context = contexts[index] if index < len(contexts) else None
            if context is not None:
                item["request_id"] = context.id
                item["parameters"] = dict(context.parameters)
                item["correlation_id"] = context.correlation_id
            described.append(item)
            tensors.extend(feeds.items())
        seq = next(self._executes)
        return seq, ipc.Message(ipc.EXECUTE, {"requests": described, "seq": seq}, tensors)

    def _await_reply(
        self,
        worker: Worker,
        seq: int,
        cancelled: Sequence[CancelSignal],
        traces: Sequence[object | None],
        pending: Callable[[], ipc.Message] | None,
        deadline: float,
    ) -> ipc.Message:
        """The worker's answer to EXECUTE `seq` (blocking), serving its BLS calls and passing
        on cancellations meanwhile. `pending` reads a message already on its way (the event
        loop's hand-off, `agent.backends.python.on_loop`), handled before the pipe is waited on.

        Raises:
            ModelInstanceFailedError: the worker hung (and was killed), died, or sent a
                malformed message.
        """
        calls = BlsCalls(
            self._bls, worker.wakeup, worker.send, self.timeouts.execute_s, self.name, traces
        )
        calls.watch(seq, cancelled)
        try:
            # The worker's own time counts: the clock restarts when its BLS calls are answered.
            while True:
                if pending is not None:
                    first = pending()
                    pending = None
                    reply = None if self._side.handle(worker, first) else first
                else:
                    busy = calls.busy
                    readable = calls.wait(deadline)
                    if busy:
                        deadline = time.monotonic() + self.timeouts.execute_s
                    calls.tell_cancelled()
                    if not readable:
                        if not calls.busy and time.monotonic() >= deadline:
                            raise TimeoutError
                        continue
                    reply = self._side.receive_one(worker, deadline)
                if reply is None:
                    continue  # a log line: BLS results must keep flowing meanwhile
                if reply.kind == ipc.BLS:
                    calls.start(reply)
                elif reply.kind == ipc.BLS_CANCEL:
                    calls.drop(reply)
                else:
                    return reply
        except TimeoutError:
            self._hung(worker)
        except ipc.WireError as exc:  # a bug on one side: the worker's state is unknown
            self._kill(worker, f"sent a malformed message ({exc})")
        except (EOFError, OSError):
            raise ModelInstanceFailedError(self._ended(worker)) from None
        finally:
            calls.cancel()  # calls still running (abandoned, or the worker died) are cancelled

    def _answers(
        self, worker: Worker, reply: ipc.Message, requests: Sequence[RequestFeeds]
    ) -> list[NamedOutputs | AgentError]:
        """Each request's outputs (checked against the config) or error, from RESULT or ERROR.

        Raises:
            BackendError: `execute` raised or returned a wrong number of responses.
        """
        if reply.kind == ipc.ERROR:
            if reply.meta.get("user"):  # execute raised: Triton's words
                raise raised_error(worker.name, reply.meta)
            raise BackendError(
                f"python model '{self.name}' execute failed: {reply.meta.get('message', '')}"
            )
        answers = reply.meta.get("responses")
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise BackendError(f"python model '{self.name}': malformed answer from the worker")
        results: list[NamedOutputs | AgentError] = []
        offset = 0
        for (feeds, names), answer in zip(requests, answers, strict=True):
            count = int(answer.get("tensors", 0))
            returned = dict(reply.tensors[offset : offset + count])
            offset += count
            if "code" in answer:  # the model's own TritonError: its message and code
                results.append(reported_error(str(answer["error"]), answer["code"]))
                continue
            if "error" in answer:
                results.append(
                    BackendError(f"python model '{self.name}' execute failed: {answer['error']}")
                )
                continue
            rows = next(iter(feeds.values())).shape[0] if self._batched and feeds else None
            try:
                outputs = requested_outputs(self.name, self._declared, names, returned, rows)
                params = answer.get("parameters")
                results.append(ModelOutputs(outputs, params) if params else outputs)
            except BackendError as exc:
                results.append(exc)
        return results

    def _hung(self, worker: Worker) -> NoReturn:
        """Kill a worker that gave no answer in time; its requests fail, the supervisor
        restarts it."""
        self._kill(worker, f"hung: no response within {self.timeouts.execute_s:g} s")

    def _kill(self, worker: Worker, verdict: str) -> NoReturn:
        if self._supervisor is not None:
            self._supervisor.hung(worker, verdict)
        else:
            kill_worker(worker, verdict)
        raise ModelInstanceFailedError(self._ended(worker))

    def _ended(self, worker: Worker) -> str:
        """Why the worker's requests failed, once it ended."""
        return f"python model '{self.name}' instance {worker.index} {exit_reason(worker)}"


class _NotTaken(Exception):
    """The worker was gone before EXECUTE reached it: its requests can go to another."""
