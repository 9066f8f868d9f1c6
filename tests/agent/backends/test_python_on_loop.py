"""An `execute` awaited on the event loop: answered there, or handed to a thread where it must
wait (BLS, a frame still arriving, a closed pipe, the timeout); cancellations told from the loop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import numpy as np

from agent.backends.cancellation import CancelSignal
from agent.backends.python import ipc
from agent.backends.python.on_loop import LoopCall

Pending = Callable[[], ipc.Message] | None


class Recorder:
    """The callbacks of one call: what reached each, and the answers they give."""

    def __init__(self) -> None:
        self.side: list[str] = []
        self.finished: list[ipc.Message] = []
        self.handed: list[tuple[ipc.Message | str | None, float]] = []
        self.threads: list[str] = []  # where finish / handoff ran
        self.sent: list[ipc.Message] = []
        self.told = threading.Event()

    def send(self, message: ipc.Message) -> None:
        self.sent.append(message)
        self.told.set()

    def on_side(self, message: ipc.Message) -> bool:
        if message.kind == ipc.LOG:
            self.side.append(str(message.meta.get("message")))
            return True
        return False

    def finish(self, reply: ipc.Message) -> str:
        self.finished.append(reply)
        self.threads.append(threading.current_thread().name)
        return "on the loop"

    def handoff(self, pending: Pending, deadline: float) -> str:
        self.threads.append(threading.current_thread().name)
        first: ipc.Message | str | None = None
        if pending is not None:
            try:
                first = pending()
            except (EOFError, OSError) as exc:
                first = type(exc).__name__
        self.handed.append((first, deadline))
        return "on a thread"


def pair() -> tuple[Connection, Connection]:
    agent_end, worker_end = multiprocessing.Pipe()
    os.set_blocking(agent_end.fileno(), False)
    return agent_end, worker_end


async def call(
    agent_end: Connection,
    recorder: Recorder,
    write: Callable[[], None],
    *,
    timeout_s: float = 30.0,
    cancelled: tuple[CancelSignal, ...] = (),
) -> str:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1, thread_name_prefix="version")
    running = LoopCall(
        loop,
        executor,
        agent_end,
        recorder.send,
        7,
        cancelled,
        timeout_s,
        recorder.on_side,
        recorder.finish,
        recorder.handoff,
    )
    await asyncio.to_thread(write)
    try:
        return await running.future
    finally:
        executor.shutdown()


def test_the_answer_is_read_and_finished_on_the_loop_after_side_messages() -> None:
    agent_end, worker_end = pair()
    recorder = Recorder()

    def write() -> None:
        ipc.send(worker_end, ipc.Message(ipc.LOG, {"message": "hello"}))
        ipc.send(
            worker_end,
            ipc.Message(ipc.RESULT, {"responses": [{"tensors": 1}]}, [("Y", np.ones(3))]),
        )

    async def main() -> tuple[str, str]:
        return await call(agent_end, recorder, write), threading.current_thread().name

    answer, loop_thread = asyncio.run(main())
    assert answer == "on the loop"
    assert recorder.side == ["hello"]
    assert recorder.finished[0].tensors[0][1].tolist() == [1.0, 1.0, 1.0]
    assert recorder.threads == [loop_thread]
    assert recorder.handed == []


def test_a_bls_call_hands_the_execute_to_a_thread_with_that_message() -> None:
    agent_end, worker_end = pair()
    recorder = Recorder()

    def write() -> None:
        ipc.send(worker_end, ipc.Message(ipc.BLS, {"id": 1, "model": "m"}))

    answer = asyncio.run(call(agent_end, recorder, write))
    assert answer == "on a thread"
    first, _ = recorder.handed[0]
    assert isinstance(first, ipc.Message)
    assert first.kind == ipc.BLS
    assert recorder.threads[0].startswith("version")  # the executor given, not the default
    assert recorder.finished == []


def test_a_frame_still_arriving_is_read_by_the_thread() -> None:
    agent_end, worker_end = pair()
    recorder = Recorder()
    big = np.arange(1 << 20, dtype=np.float32)  # more than a socket buffer holds

    def write() -> None:
        ipc.send(worker_end, ipc.Message(ipc.RESULT, {"responses": []}, [("Y", big)]))

    assert asyncio.run(call(agent_end, recorder, write)) == "on a thread"
    first, _ = recorder.handed[0]
    assert isinstance(first, ipc.Message)
    np.testing.assert_array_equal(first.tensors[0][1], big)


def test_a_closed_pipe_is_handed_to_the_thread() -> None:
    agent_end, worker_end = pair()
    recorder = Recorder()
    assert asyncio.run(call(agent_end, recorder, worker_end.close)) == "on a thread"
    first, _ = recorder.handed[0]
    assert first in (None, "EOFError")  # the thread reads the EOF itself, or is given it


def test_no_answer_by_the_timeout_hands_the_execute_to_the_thread_past_its_deadline() -> None:
    agent_end, _worker_end = pair()
    recorder = Recorder()
    assert asyncio.run(call(agent_end, recorder, lambda: None, timeout_s=0.0)) == "on a thread"
    assert recorder.handed[0][0] is None


def test_a_cancelled_request_is_told_to_the_worker_from_the_loop() -> None:
    agent_end, worker_end = pair()
    recorder = Recorder()
    signals = (CancelSignal(), CancelSignal())

    def write() -> None:
        signals[1].cancel()
        recorder.told.wait(30)
        ipc.send(worker_end, ipc.Message(ipc.RESULT, {"responses": []}))

    assert asyncio.run(call(agent_end, recorder, write, cancelled=signals)) == "on the loop"
    assert [(m.kind, m.meta) for m in recorder.sent] == [(ipc.CANCEL, {"seq": 7, "requests": [1]})]
