"""DeadlineTimer on asyncio's loop and on uvloop: fires once, never early, re-arms, closes."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from agent.scheduling.deadline_timer import DeadlineTimer
from tests.support import wait_until_async

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run(factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("loop", LOOPS)
def test_fires_once_and_never_before_its_deadline(loop: str) -> None:
    async def main() -> None:
        fired: list[float] = []
        done = asyncio.Event()

        def callback() -> None:
            fired.append(time.monotonic())
            done.set()

        timer = DeadlineTimer(asyncio.get_running_loop(), callback)
        deadline = time.monotonic() + 0.0003  # below the loop timers' millisecond
        timer.arm(deadline)
        await done.wait()
        assert fired[0] >= deadline
        # A second timer, armed later, fires after the first could have fired again.
        second = asyncio.Event()
        other = DeadlineTimer(asyncio.get_running_loop(), second.set)
        other.arm(time.monotonic() + 0.002)
        await second.wait()
        assert len(fired) == 1
        timer.close()
        other.close()

    run(LOOPS[loop], main())


@pytest.mark.parametrize("loop", LOOPS)
def test_rearming_replaces_the_deadline_and_none_disarms(loop: str) -> None:
    async def main() -> None:
        calls: list[str] = []
        first_done = asyncio.Event()
        marker_done = asyncio.Event()

        def first() -> None:
            calls.append("first")
            first_done.set()

        timer = DeadlineTimer(asyncio.get_running_loop(), first)
        timer.arm(time.monotonic() + 3600)  # replaced by a near deadline
        timer.arm(time.monotonic() + 0.001)
        await first_done.wait()
        timer.arm(time.monotonic() + 0.001)
        timer.arm(None)  # disarmed before it was due
        marker = DeadlineTimer(asyncio.get_running_loop(), marker_done.set)
        marker.arm(time.monotonic() + 0.005)
        await marker_done.wait()
        assert calls == ["first"]
        timer.close()
        marker.close()

    run(LOOPS[loop], main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_past_deadline_fires_at_once(loop: str) -> None:
    async def main() -> None:
        done = asyncio.Event()
        timer = DeadlineTimer(asyncio.get_running_loop(), done.set)
        timer.arm(time.monotonic() - 1.0)
        await asyncio.wait_for(done.wait(), timeout=5)
        timer.close()

    run(LOOPS[loop], main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux only")
@pytest.mark.parametrize("loop", LOOPS)
def test_on_linux_it_is_a_timerfd_released_by_close_from_any_thread(loop: str) -> None:
    async def main() -> None:
        before = open_fds()
        timer = DeadlineTimer(asyncio.get_running_loop(), lambda: None)
        assert timer.precise
        assert open_fds() == before + 1
        timer.arm(time.monotonic() + 3600)
        closer = threading.Thread(target=timer.close)
        closer.start()
        closer.join()
        # The close is handed to the loop: wait for it rather than count turns.
        await wait_until_async(lambda: open_fds() == before, "the timerfd closed", timeout_s=5)

    run(LOOPS[loop], main())
