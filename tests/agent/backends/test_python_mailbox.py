"""The worker's mailbox: the main thread reads the pipe while it waits in `receive`; a relief
thread reads it while the main thread is busy (a long `execute`) or a call waits for a reply.
Nothing here asserts timings: each wait is for an event, bounded generously."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import numpy as np
import pytest

from agent.backends.python import ipc
from agent.backends.python.worker.mailbox import Mailbox

_WAIT_S = 10.0


class _Filed:
    """What the mailbox handed to its callbacks, and on which thread."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, ipc.Message]] = []
        self.arrived = threading.Event()

    def __call__(self, message: ipc.Message) -> None:
        self.messages.append((threading.current_thread().name, message))
        self.arrived.set()

    def wait(self) -> tuple[str, ipc.Message]:
        assert self.arrived.wait(_WAIT_S), "nothing was filed"
        self.arrived.clear()
        return self.messages[-1]


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    agent_end, worker_end = multiprocessing.Pipe(duplex=True)
    yield agent_end, worker_end
    agent_end.close()  # a relief thread still reading sees EOF and ends
    worker_end.close()


def test_the_main_thread_reads_for_itself_and_files_pings_on_the_way(
    pipe: tuple[Connection, Connection],
) -> None:
    agent_end, worker_end = pipe
    pings = _Filed()
    mailbox = Mailbox(worker_end, on_ping=pings)  # no relief thread: only `receive` reads
    ipc.send(agent_end, ipc.Message(ipc.PING, {"n": 1}))
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))
    assert mailbox.receive().meta == {"seq": 1}
    thread, ping = pings.wait()
    assert (thread, ping.meta) == (threading.current_thread().name, {"n": 1})


def test_pings_and_cancels_are_read_while_the_main_thread_is_busy(
    pipe: tuple[Connection, Connection],
) -> None:
    agent_end, worker_end = pipe
    pings, cancels = _Filed(), _Filed()
    mailbox = Mailbox(worker_end, on_cancel=cancels, on_ping=pings)
    mailbox.start()
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))
    assert mailbox.receive().meta == {"seq": 1}
    # The main thread now runs a long `execute` (it stays out of `receive`).
    ipc.send(agent_end, ipc.Message(ipc.CANCEL, {"seq": 1, "requests": [0]}))
    ipc.send(agent_end, ipc.Message(ipc.PING, {"n": 7}))
    assert cancels.wait()[1].meta == {"seq": 1, "requests": [0]}
    thread, ping = pings.wait()
    assert ping.meta == {"n": 7}
    assert thread != threading.current_thread().name
    # The next message for the main loop comes to `receive` with the pipe, in order.
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 2}))
    ipc.send(agent_end, ipc.Message(ipc.PING, {"n": 8}))
    ipc.send(agent_end, ipc.Message(ipc.FINALIZE))
    assert mailbox.receive().meta == {"seq": 2}
    assert mailbox.receive().kind == ipc.FINALIZE
    assert pings.messages[-1][1].meta == {"n": 8}


def _executing(pipe: tuple[Connection, Connection]) -> tuple[Connection, Mailbox]:
    """The agent's end and a started mailbox whose main loop has taken EXECUTE 1 (it runs)."""
    agent_end, worker_end = pipe
    mailbox = Mailbox(worker_end)
    mailbox.start()
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))
    assert mailbox.receive().meta == {"seq": 1}
    return agent_end, mailbox


def test_a_reply_is_read_at_once_while_the_main_thread_waits_for_it(
    pipe: tuple[Connection, Connection],
) -> None:
    agent_end, mailbox = _executing(pipe)
    for call_id in (1, 2, 3):  # BLS calls inside one execute, one after the other
        slot = mailbox.expect(call_id)
        ipc.send(agent_end, ipc.Message(ipc.BLS_RESULT, {"id": call_id}, [("Y", np.ones(2))]))
        assert slot.result(_WAIT_S).meta == {"id": call_id}
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 2}))
    assert mailbox.receive().meta == {"seq": 2}


def test_a_streamed_reply_reaches_its_callback_while_the_main_thread_waits_in_receive(
    pipe: tuple[Connection, Connection],
) -> None:
    # A decoupled model's own thread calls BLS while `execute` is not running.
    agent_end, worker_end = pipe
    replies = _Filed()
    mailbox = Mailbox(worker_end)
    mailbox.start()
    got: list[ipc.Message] = []
    main_loop = threading.Thread(target=lambda: got.append(mailbox.receive()))
    main_loop.start()
    mailbox.expect_stream(5, replies)
    ipc.send(agent_end, ipc.Message(ipc.BLS_RESULT, {"id": 5, "final": False}))
    assert replies.wait()[1].meta == {"id": 5, "final": False}
    ipc.send(agent_end, ipc.Message(ipc.BLS_RESULT, {"id": 5, "final": True}))
    assert replies.wait()[1].meta == {"id": 5, "final": True}
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))
    main_loop.join(_WAIT_S)
    assert [m.meta for m in got] == [{"seq": 1}]


def test_a_long_idle_wait_does_not_stop_the_relief_from_reading_during_execute(
    pipe: tuple[Connection, Connection],
) -> None:
    agent_end, worker_end = pipe
    pings = _Filed()
    mailbox = Mailbox(worker_end, on_ping=pings)
    mailbox.start()

    def late_execute() -> None:
        time.sleep(1.5)  # long enough an idle wait for the relief thread to stop checking
        ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))

    sender = threading.Thread(target=late_execute)
    sender.start()
    assert mailbox.receive().meta == {"seq": 1}
    sender.join()
    ipc.send(agent_end, ipc.Message(ipc.PING, {"n": 1}))  # during the execute
    thread, _ = pings.wait()
    assert thread != threading.current_thread().name


def test_a_closed_pipe_ends_receive_and_answers_waiting_calls_while_relieved(
    pipe: tuple[Connection, Connection],
) -> None:
    agent_end, mailbox = _executing(pipe)
    waiting = mailbox.expect(9)  # the relief reads now
    agent_end.close()
    assert "the agent is gone" in str(waiting.result(_WAIT_S).meta["error"])
    for _ in range(2):  # this receive and every one after it
        with pytest.raises(EOFError):
            mailbox.receive()
