"""sd_notify pieces on their own (agent/runtime/systemd_notify.py): addresses, no-ops, intervals,
pings."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agent.runtime.systemd_notify import Notifier, WatchdogPinger, watchdog_interval_s
from tests.deploy.support import notify_socket


def test_without_notify_socket_everything_is_a_no_op() -> None:
    notifier = Notifier.from_environ({})
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False
    assert WatchdogPinger.from_environ(notifier, {"WATCHDOG_USEC": "1000"}).active is False


def test_messages_reach_path_and_abstract_sockets(tmp_path: Path) -> None:
    for abstract in (False, True):
        with notify_socket(tmp_path, abstract=abstract) as (sock, address):
            notifier = Notifier(address)
            assert notifier.ready("serving  2\nmodels")
            assert sock.receive(5) == {"READY": "1", "STATUS": "serving 2 models"}
            assert notifier.stopping()
            assert sock.receive(5) == {"STOPPING": "1"}
            notifier.close()


def test_a_missing_receiver_is_not_an_error(tmp_path: Path) -> None:
    assert Notifier(str(tmp_path / "nobody.sock")).ready() is False


def test_watchdog_interval_is_half_and_only_for_our_pid() -> None:
    pid = os.getpid()
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000"}) == 0.1
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(pid)}) == 0.1
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}, pid=2) == 0.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "x"}) == 0.0
    assert watchdog_interval_s({}) == 0.0


def test_pinger_pings_from_the_loop_until_stopped(tmp_path: Path) -> None:
    with notify_socket(tmp_path) as (sock, address):
        notifier = Notifier(address)

        async def run() -> None:
            pinger = WatchdogPinger(notifier, 0.01)
            pinger.start()
            assert pinger.active
            for _ in range(3):
                assert await asyncio.to_thread(sock.receive, 5) == {"WATCHDOG": "1"}
            await pinger.stop()
            assert not pinger.active

        asyncio.run(run())
        sock.drain()
        assert sock.receive(0.05) is None  # 5 intervals of 10 ms: a ping would have come
        notifier.close()
