"""What the fleet benchmarks share: the simulator and the manager's tools as child processes
with their CPU and memory measured, the broker's message counters, scraping, and the checks.

Every child is the real program (`python -m bench.fleet_sim`, `python -m agent fleet ...`),
started here and ended by its pid. A child that exits is reaped with `os.wait4`, whose resource
usage gives its exact CPU time and peak RSS; one that runs throughout is sampled with psutil.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agent.wire.mqtt import Message, MqttClient, MqttSettings
from bench.fleet_brokers import open_files, stop_pid, wait_for

REPO = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
_CONTROL = re.compile(r"control on (http://\S+)")
_DEVICE_UP = re.compile(r'^edge_fleet_device_up\{device="([^"]+)"', re.MULTILINE)
_SERVED = re.compile(r"^edge_fleet_exporter_devices ([0-9.e+]+)$", re.MULTILINE)


def fleet_cli(broker: tuple[str, int], *argv: str, http: bool = False) -> list[str]:
    """`python -m agent fleet ARGV` against `broker` (`http`: the verb has its own --port)."""
    host, port = broker
    flags = [
        "--mqtt-host" if http else "--host",
        host,
        "--mqtt-port" if http else "--port",
        str(port),
    ]
    return [sys.executable, "-m", "agent", "fleet", *argv, *flags]


@dataclass(frozen=True, slots=True)
class Usage:
    """What a child used: wall and CPU seconds, peak RSS."""

    wall_s: float
    cpu_s: float
    rss_mb: float

    @property
    def cpu_percent(self) -> float:
        """CPU time over wall time, in % of one core."""
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s else 0.0


class Child:
    """A child process whose stdout goes to a file; `finish` reaps it with its usage."""

    def __init__(
        self, argv: Sequence[str], log: Path, *, files: int = 0, stdout: Path | None = None
    ) -> None:
        self.log = log
        self.out = stdout or log
        self.started = time.monotonic()
        with log.open("wb") as err, self.out.open("ab") as out:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=err,
                cwd=REPO,
                preexec_fn=open_files(files) if files else None,  # noqa: PLW1509
            )
        self._ps = psutil.Process(self.proc.pid)
        self.usage: Usage | None = None

    def text(self) -> str:
        """What it printed so far (stdout)."""
        return self.out.read_text(errors="replace")

    def rss_mb(self) -> float:
        """Its RSS now."""
        with contextlib.suppress(psutil.Error):
            return float(self._ps.memory_info().rss) / MB
        return 0.0

    def cpu_s(self) -> float:
        """CPU seconds it used so far."""
        with contextlib.suppress(psutil.Error):
            times = self._ps.cpu_times()
            return float(times.user + times.system)
        return self.usage.cpu_s if self.usage else 0.0

    def wait(self, timeout_s: float) -> int:
        """Wait for it to exit (reaped with its usage); SIGKILL after `timeout_s`."""
        if self.usage is not None:
            return int(self.proc.returncode)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self._reaped(status, rusage)
                return int(self.proc.returncode)
            time.sleep(0.1)
        self.proc.kill()
        _pid, status, rusage = os.wait4(self.proc.pid, 0)
        self._reaped(status, rusage)
        raise TimeoutError(f"{self.proc.args!r} ran past {timeout_s:g} s (log: {self.log})")

    def exited(self) -> bool:
        """Whether it ended (without reaping it: `wait` does, with its usage)."""
        with contextlib.suppress(psutil.Error):
            return self._ps.status() == psutil.STATUS_ZOMBIE
        return True

    def finish(self, grace_s: float = 20.0) -> Usage:
        """Stop it (SIGTERM by pid, then SIGKILL) and reap it; its usage."""
        if self.usage is None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            with contextlib.suppress(TimeoutError):
                self.wait(grace_s)
        assert self.usage is not None
        return self.usage

    def _reaped(self, status: int, rusage: Any) -> None:
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.usage = Usage(
            wall_s=time.monotonic() - self.started,
            cpu_s=rusage.ru_utime + rusage.ru_stime,
            rss_mb=rusage.ru_maxrss / 1024,  # kilobytes on Linux
        )


def run(argv: Sequence[str], log: Path, timeout_s: float) -> tuple[int, str, Usage]:
    """Run a child to its end: exit code, its stdout (stderr goes to `log`), usage."""
    child = Child(argv, log, stdout=log.with_suffix(".out"))
    code = child.wait(timeout_s)
    assert child.usage is not None
    return code, child.text(), child.usage


class Simulator:
    """`python -m bench.fleet_sim` as a child; its control port answers `summary()`."""

    def __init__(self, args: Sequence[str], log: Path, devices: int) -> None:
        self.devices = devices
        argv = [sys.executable, "-m", "bench.fleet_sim", "--devices", str(devices), *args]
        self.child = Child(argv, log, files=devices + 1024)
        self.url = ""

    def wait_connected(self, timeout_s: float) -> float:
        """Wait until every device is connected; seconds it took since the start."""

        def control() -> bool:
            if self.child.exited():
                raise RuntimeError(f"the simulator exited: {self.child.text()[-2000:]}")
            found = _CONTROL.search(self.child.text())
            if found:
                self.url = found.group(1)
            return bool(found)

        wait_for(control, "the simulator's control port", 60)
        wait_for(lambda: self.summary()["connected"] >= self.devices, "every device", timeout_s)
        return time.monotonic() - self.child.started

    def summary(self) -> dict[str, Any]:
        """What the simulator says (`bench.fleet_sim.Simulator.summary`)."""
        with urllib.request.urlopen(self.url, timeout=60) as answer:
            return dict(json.load(answer))

    def stop(self) -> Usage:
        """Disconnect every device and stop; its usage."""
        return self.child.finish(60.0)


class BrokerCounters:
    """The broker's `$SYS` counters (Mosquitto; every second): `publish/messages/received` and
    `sent` (PUBLISH packets), `messages/received` and `sent` (every packet, acks included)."""

    def __init__(self, settings: MqttSettings) -> None:
        self.values: dict[str, float] = {}
        self._settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._client: MqttClient | None = None

    def __enter__(self) -> BrokerCounters:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self._client = MqttClient(self._settings, on_message=self._on_message)
        await self._client.start()
        await self._client.subscribe("$SYS/broker/messages/+", qos=0)
        await self._client.subscribe("$SYS/broker/publish/messages/+", qos=0)

    def _on_message(self, message: Message) -> None:
        with contextlib.suppress(ValueError):
            self.values[message.topic.removeprefix("$SYS/broker/")] = float(message.payload)

    def mark(self) -> tuple[float, dict[str, float]]:
        """(now, the counters now), for a rate between two marks."""
        return time.monotonic(), dict(self.values)

    def __exit__(self, *_exc: object) -> None:
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def rates(
    start: tuple[float, dict[str, float]], end: tuple[float, dict[str, float]]
) -> dict[str, float]:
    """Messages per second between two `BrokerCounters.mark`s."""
    took = max(1e-9, end[0] - start[0])
    return {k: round((end[1][k] - start[1].get(k, 0.0)) / took, 1) for k in end[1]}


@dataclass(slots=True)
class Sampler:
    """CPU seconds and peak RSS of long-running processes, sampled every `every_s`."""

    pids: dict[str, list[int]]
    every_s: float = 0.5
    peak_mb: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def cpu_s(self, name: str) -> float:
        """CPU seconds the named processes (and their children) used so far."""
        return sum(self.cpu_by_pid(name).values())

    def cpu_by_pid(self, name: str) -> dict[int, float]:
        """CPU seconds so far of each named process still running (children included)."""
        found: dict[int, float] = {}
        for pid in self.pids[name]:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                total = 0.0
                for p in [proc, *proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = p.cpu_times()
                        total += t.user + t.system
                found[pid] = total
        return found

    def _rss(self, name: str) -> float:
        total = 0.0
        for pid in self.pids[name]:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                for p in [proc, *proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
        return total / MB

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for name in self.pids:
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), self._rss(name))

    @contextlib.contextmanager
    def running(self) -> Iterator[Sampler]:
        """Sample in a thread while the block runs."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)


def scrape(url: str) -> tuple[str, float, int]:
    """GET a metrics page: its text, seconds, bytes."""
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as answer:
        body = answer.read()
    return body.decode(), time.monotonic() - started, len(body)


def get_json(url: str) -> tuple[dict[str, Any], float, int]:
    """GET a JSON document: it, seconds, bytes."""
    text, took, size = scrape(url)
    return dict(json.loads(text)), took, size


def exporter_devices(metrics: str) -> tuple[set[str], float]:
    """The devices an exporter's page serves (`edge_fleet_device_up` labels) and what it says
    it serves (`edge_fleet_exporter_devices`)."""
    served = _SERVED.search(metrics)
    return set(_DEVICE_UP.findall(metrics)), float(served.group(1)) if served else -1.0


def rollout_events(db: Path, rollout: str) -> list[dict[str, Any]]:
    """The stored events of a rollout, oldest first."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT doc FROM rollout_events WHERE rollout = ? ORDER BY n", [rollout]
        ).fetchall()
    return [json.loads(r[0]) for r in rows]


def rollout_state(db: Path, rollout: str) -> dict[str, Any]:
    """The stored state of a rollout (`Rollout.to_json`)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT state FROM rollouts WHERE id = ?", [rollout]).fetchone()
    return dict(json.loads(row[0]))


@dataclass(slots=True)
class Checks:
    """Named pass/fail checks with what was seen."""

    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: object = "") -> bool:
        """Record one check; returns `ok`."""
        self.results.append((name, bool(ok), str(detail)[:300]))
        return bool(ok)

    @property
    def failed(self) -> list[tuple[str, bool, str]]:
        """The checks that did not hold."""
        return [r for r in self.results if not r[1]]

    def table(self) -> str:
        """One line per check."""
        return "\n".join(
            f"  {'ok  ' if ok else 'FAIL'} {name}{'' if ok else f': {detail}'}"
            for name, ok, detail in self.results
        )


def table(rows: Sequence[Sequence[object]]) -> str:
    """A plain table (the first row is the header)."""
    text = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(text[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in text]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def stop_all(children: Sequence[Child | None]) -> None:
    """Stop children by pid, newest first (errors do not stop the others)."""
    for child in reversed(children):
        if child is not None:
            with contextlib.suppress(Exception):
                child.finish()


__all__ = [
    "MB",
    "BrokerCounters",
    "Checks",
    "Child",
    "Sampler",
    "Simulator",
    "Usage",
    "exporter_devices",
    "fleet_cli",
    "get_json",
    "rates",
    "rollout_events",
    "rollout_state",
    "run",
    "scrape",
    "stop_all",
    "stop_pid",
    "table",
]
