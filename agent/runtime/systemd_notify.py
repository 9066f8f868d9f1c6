"""sd_notify(3) for the agent: readiness, status, stopping and watchdog pings to systemd.

systemd passes `NOTIFY_SOCKET` (a filesystem path, or `@name` for an abstract socket) to a
`Type=notify` service; each message is one datagram of `KEY=VALUE` lines. With `WatchdogSec=`
it also passes `WATCHDOG_USEC` (and `WATCHDOG_PID`, the process it expects the pings from).

Invariants:

* Without `NOTIFY_SOCKET` (not under systemd, or in tests) every call is a no-op returning False.
* Sending never blocks the caller: the socket is non-blocking, and a full or vanished receiver
  loses that one message (logged at debug level); systemd re-sends nothing, and neither do we.
* `WatchdogPinger` sends `WATCHDOG=1` from a task on the event loop itself, every half of
  `WATCHDOG_USEC`. A loop that stalls (a blocking call, a busy callback) stops the pings, and
  systemd kills and restarts the service once `WatchdogSec=` passes without one: that is the point.

Example (the daemon's wiring):
    >>> notifier = Notifier.from_environ({})
    >>> notifier.ready("serving 2 models")
    False
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping

__all__ = [
    "STALL_HOOK_ENV",
    "Notifier",
    "StatusLogHandler",
    "WatchdogPinger",
    "install_stall_hook",
    "watchdog_interval_s",
]

logger = logging.getLogger(__name__)

STALL_HOOK_ENV = "EDGE_AGENT_STALL_ON_SIGUSR1"
_MAX_STATUS_CHARS = 1024  # systemd shows one line; keep datagrams small


class Notifier:
    """Sends sd_notify messages to one `NOTIFY_SOCKET` address (or nowhere)."""

    def __init__(self, address: str | None) -> None:
        """Args:
        address: the `NOTIFY_SOCKET` value: a path, `@name` (abstract), or None (no-op).
        """
        self._address: str | bytes | None = _socket_address(address) if address else None
        self._sock: socket.socket | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for `environ["NOTIFY_SOCKET"]` (default: `os.environ`)."""
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET") or None)

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to send to."""
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send `KEY=VALUE` fields as one datagram.

        Returns:
            True when the datagram was handed to the kernel; False when notification is off or
            the send failed (never raises: notification is best effort).
        """
        if self._address is None:
            return False
        message = "\n".join(fields).encode("utf-8", errors="replace")
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message, self._address)
        except OSError as exc:
            logger.debug("sd_notify %r failed: %s", fields, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1: start-up is complete (models loaded, port listening)."""
        return self.notify("READY=1", *_status_field(status))

    def status(self, text: str) -> bool:
        """STATUS=...: a one-line progress or state message for `systemctl status`."""
        return self.notify(*_status_field(text))

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC: a reload started (send `ready()` when done)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: shutdown began."""
        return self.notify("STOPPING=1", *_status_field(status))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the service is alive."""
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        """Close the socket (further sends reopen it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class StatusLogHandler(logging.Handler):
    """Forwards log messages as STATUS= lines (attach during start-up for load progress).

    `systemctl status edge-agent` then shows e.g. "model resnet version 2 ready (...)" while the
    models load. Records below INFO are not sent.
    """

    def __init__(self, notifier: Notifier) -> None:
        """Args:
        notifier: where the status lines go.
        """
        super().__init__(logging.INFO)
        self._notifier = notifier

    def emit(self, record: logging.LogRecord) -> None:
        """Send the record's message as STATUS= (best effort, like every notification)."""
        if not self._notifier.enabled:
            return
        try:
            self._notifier.status(record.getMessage())
        except (TypeError, ValueError):  # a bad %-format in some log call: not our concern here
            self.handleError(record)


def watchdog_interval_s(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float:
    """Seconds between watchdog pings: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3) advises.

    Args:
        environ: the environment (default `os.environ`).
        pid: this process's id (default `os.getpid()`); when `WATCHDOG_PID` is set and names
            another process, the watchdog is not ours.

    Returns:
        The interval, or 0.0 when no watchdog is expected from this process (unset, unparsable,
        zero, or meant for another pid).
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
        expected = int(env.get("WATCHDOG_PID", "0") or "0")
    except ValueError:
        return 0.0
    if usec <= 0 or (expected and expected != (os.getpid() if pid is None else pid)):
        return 0.0
    return usec / 2_000_000


class WatchdogPinger:
    """Sends WATCHDOG=1 from the event loop every `interval_s` while started."""

    def __init__(self, notifier: Notifier, interval_s: float) -> None:
        """Args:
        notifier: where the pings go.
        interval_s: seconds between pings; 0 or less: the pinger does nothing.
        """
        self._notifier = notifier
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_environ(
        cls, notifier: Notifier, environ: Mapping[str, str] | None = None
    ) -> WatchdogPinger:
        """A pinger at half of `WATCHDOG_USEC` (inactive without it or without a socket)."""
        interval = watchdog_interval_s(environ) if notifier.enabled else 0.0
        return cls(notifier, interval)

    @property
    def active(self) -> bool:
        """Whether pings are being sent."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start pinging (call on the running loop; a second call does nothing)."""
        if self._interval_s <= 0 or self.active:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sd-watchdog")
        logger.info("systemd watchdog: pinging every %.3f s", self._interval_s)

    async def stop(self) -> None:
        """Stop pinging and wait for the task to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        # Runs on the loop: a ping is sent only when the loop gets round to this task, so a stalled
        # loop sends none. Pinging from a thread would keep a hung agent alive.
        while True:
            self._notifier.watchdog()
            await asyncio.sleep(self._interval_s)


def install_stall_hook(
    loop: asyncio.AbstractEventLoop, environ: Mapping[str, str] | None = None
) -> bool:
    """Test-only: with `EDGE_AGENT_STALL_ON_SIGUSR1=SECONDS`, SIGUSR1 blocks the loop that long.

    The stall runs `time.sleep` inside a loop callback, which is exactly the bug the watchdog
    exists to catch; the tests use it to see the pings stop. Without the variable (production)
    nothing is installed.

    Returns:
        Whether the hook was installed.
    """
    env = os.environ if environ is None else environ
    raw = env.get(STALL_HOOK_ENV, "")
    if not raw:
        return False
    try:
        seconds = float(raw)
    except ValueError:
        logger.warning(
            "%s=%r is not a number of seconds; stall hook not installed", STALL_HOOK_ENV, raw
        )
        return False

    def stall() -> None:
        logger.warning("stalling the event loop for %.1f s (test hook %s)", seconds, STALL_HOOK_ENV)
        time.sleep(seconds)  # deliberately blocking: this is the fault being simulated
        logger.warning("event loop stall over")

    loop.add_signal_handler(signal.SIGUSR1, stall)
    return True


def _socket_address(value: str) -> str | bytes:
    """`@name` is an abstract socket: the kernel name starts with a NUL byte."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def _status_field(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    line = " ".join(text.split())[:_MAX_STATUS_CHARS]
    return (f"STATUS={line}",)
