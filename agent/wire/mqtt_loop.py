"""paho-mqtt's network loop on the asyncio event loop, shared by many clients in one process.

`MqttClient` normally runs paho's network loop in a thread of its own (`loop_start`): right for
the agent and the manager, which hold one or a few connections. A process that holds thousands
(the fleet simulator's devices) cannot afford a thread each, so `LoopNetwork` drives their
sockets from the event loop instead, the way paho documents for an external loop: each socket
is watched with `add_reader`/`add_writer` (paho's `on_socket_*` callbacks), one task calls
`loop_misc` (keepalive pings, ping timeouts) of every client once a second, and a lost
connection is retried after the client's exponential backoff, with jitter so that thousands of
clients cut off together do not come back in one burst. Measured: 5.5 KiB of memory per client,
10,000 connections in about 6 s (bench/fleet10k.md).

Invariants:
    * Everything runs on the loop that created the `LoopNetwork`; paho's callbacks too.
    * At most `max_connecting` clients wait for their CONNACK at a time: a broker's listen
      backlog (Mosquitto: 100) is not overrun by a fleet connecting at once.
    * The TCP connect itself is paho's, and blocking: fine against brokers on a LAN or loopback
      (a refused port answers at once; `connect_timeout_s` bounds the rest). This is why the
      agent and the manager keep the threaded loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho

__all__ = ["LoopNetwork"]

logger = logging.getLogger(__name__)

_MISC_EVERY_S = 1.0


@dataclass(slots=True)
class _Attached:
    client: paho.Client
    on_connect_fail: Callable[[], None]
    min_s: float
    max_s: float
    failures: int = 0
    connecting: bool = False
    stopping: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    retry: asyncio.TimerHandle | None = None


class LoopNetwork:
    """Runs the sockets of many paho clients on the running event loop (see module docstring).

    Args:
        max_connecting: Clients waiting for their CONNACK at most, at a time.
        connect_timeout_s: paho's TCP connect timeout for each attempt.
        seed: Seeds the backoff jitter (tests).
    """

    def __init__(
        self, *, max_connecting: int = 64, connect_timeout_s: float = 2.0, seed: int | None = None
    ) -> None:
        self.max_connecting = max_connecting
        self.connect_timeout_s = connect_timeout_s
        self._loop = asyncio.get_running_loop()
        self._clients: dict[paho.Client, _Attached] = {}
        self._queue: deque[_Attached] = deque()
        self._connecting = 0
        self._random = random.Random(seed)  # noqa: S311 - jitter, not a secret
        self._misc: asyncio.Task[None] | None = None
        self.connects = 0  # TCP connects attempted (figures)

    @property
    def clients(self) -> int:
        """Clients attached now."""
        return len(self._clients)

    @property
    def waiting(self) -> tuple[int, int]:
        """(clients waiting for a CONNACK, clients waiting for their turn to connect)."""
        return self._connecting, len(self._queue)

    def attach(
        self,
        client: paho.Client,
        *,
        min_s: float,
        max_s: float,
        on_connect_fail: Callable[[], None],
    ) -> None:
        """Take over a client on which `connect_async` was called; it connects in its turn.

        Args:
            client: The paho client, `connect_async` called, not started with `loop_start`
                (its `connect_timeout` set to `connect_timeout_s` before that).
            min_s: The first reconnect delay; it doubles per failure up to `max_s`.
            max_s: The longest reconnect delay.
            on_connect_fail: Told when a TCP connect fails (the broker is away).
        """
        entry = _Attached(client, on_connect_fail, min_s, max_s)
        self._clients[client] = entry
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._want_write
        client.on_socket_unregister_write = self._no_write
        self._queue.append(entry)
        self._pump()
        if self._misc is None:
            self._misc = self._loop.create_task(self._misc_loop())

    def connected(self, client: paho.Client) -> None:
        """The client got a successful CONNACK: its backoff starts over, the next one may go."""
        entry = self._clients.get(client)
        if entry is not None:
            entry.failures = 0
            self._done_connecting(entry)

    async def detach(self, client: paho.Client, timeout_s: float = 2.0) -> None:
        """Disconnect cleanly (no last will), wait until the socket closed (bounded), forget."""
        entry = self._clients.get(client)
        if entry is None:
            return
        entry.stopping = True
        if entry.retry is not None:
            entry.retry.cancel()
        with contextlib.suppress(ValueError):
            self._queue.remove(entry)
        if client.socket() is not None:
            client.disconnect()  # queued: written by the writer callback, then paho closes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.closed.wait(), timeout_s)
            if client.socket() is not None:  # the broker did not take the DISCONNECT in time
                self._close(client)
        self._done_connecting(entry)
        del self._clients[client]
        if not self._clients and self._misc is not None:
            self._misc.cancel()
            self._misc = None

    # --- connecting -------------------------------------------------------------------------

    def _pump(self) -> None:
        while self._queue and self._connecting < self.max_connecting:
            entry = self._queue.popleft()
            if entry.stopping or entry.client not in self._clients:
                continue
            self._connect(entry)

    def _connect(self, entry: _Attached) -> None:
        entry.retry = None
        entry.connecting = True
        self._connecting += 1
        self.connects += 1
        try:
            entry.client.reconnect()  # opens the socket (our reader is added) and sends CONNECT
        except OSError as exc:  # refused, unreachable, timed out
            logger.debug("MQTT connect failed: %s", exc)
            self._done_connecting(entry)
            entry.on_connect_fail()
            self._schedule(entry)

    def _done_connecting(self, entry: _Attached) -> None:
        if entry.connecting:
            entry.connecting = False
            self._connecting -= 1
            self._pump()

    def _schedule(self, entry: _Attached) -> None:
        if entry.stopping:
            return
        delay = min(entry.max_s, entry.min_s * 2 ** min(entry.failures, 30))
        entry.failures += 1
        delay *= 0.5 + self._random.random() / 2  # jitter: a cut-off fleet comes back spread out
        entry.retry = self._loop.call_later(delay, self._requeue, entry)

    def _requeue(self, entry: _Attached) -> None:
        entry.retry = None
        if not entry.stopping and entry.client in self._clients:
            self._queue.append(entry)
            self._pump()

    # --- paho's socket callbacks (on this loop) ---------------------------------------------

    def _socket_open(self, client: paho.Client, _userdata: Any, sock: Any) -> None:
        if self._loop.is_closed():
            return
        entry = self._clients.get(client)
        if entry is not None:
            entry.closed.clear()
        self._loop.add_reader(sock, client.loop_read)

    def _socket_close(self, client: paho.Client, _userdata: Any, sock: Any) -> None:
        if self._loop.is_closed():  # a client never stopped, collected after the loop ended
            return
        self._forget(sock)
        entry = self._clients.get(client)
        if entry is None:
            return
        entry.closed.set()
        self._done_connecting(entry)
        if not entry.stopping:  # lost, refused or timed out: try again after the backoff
            self._schedule(entry)

    def _want_write(self, client: paho.Client, _userdata: Any, sock: Any) -> None:
        if not self._loop.is_closed():
            self._loop.add_writer(sock, client.loop_write)

    def _no_write(self, _client: paho.Client, _userdata: Any, sock: Any) -> None:
        if not self._loop.is_closed():
            self._loop.remove_writer(sock)

    def _forget(self, sock: Any) -> None:
        with contextlib.suppress(ValueError, OSError):  # a socket already closed has no fd
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)

    def _close(self, client: paho.Client) -> None:
        sock = client.socket()
        if sock is not None:
            self._forget(sock)
            with contextlib.suppress(OSError):
                sock.close()

    async def _misc_loop(self) -> None:
        while True:
            await asyncio.sleep(_MISC_EVERY_S)
            for client in list(self._clients):
                if client.socket() is not None:
                    client.loop_misc()  # keepalive ping; closes a connection gone silent
