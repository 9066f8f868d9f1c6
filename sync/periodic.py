"""The daemon's periodic sync: a cycle every `interval_s` plus jitter, backing off when failing.

    stop = asyncio.Event()
    task = asyncio.create_task(run_periodic(config.sync, cache, cached_versions.activate, stop,
                                            events=event_sink.record))
    ...
    stop.set(); await task

    loop = SyncLoop(client, cache, activate, events=...)   # one cycle at a time (tests, `sync`)
    await loop.cycle()

`Backoff` is the pure schedule and `sync.notices` the pure "when to tell" rules; `SyncLoop` and
`run_periodic` only drive them. The clocks (`wait`, `clock`) and the randomness (`rand`) are
injected, so tests check the schedule without sleeping.

Invariants:
    * Sync never stops serving: each cycle runs in a worker thread, its errors are logged and
      turn into a longer wait, and the cache's active versions change only through `activate`
      (the agent's hot swap: load the new version, then switch, then unload the old one).
    * After `k` failed cycles in a row the wait is `min(max, base * 2**(k-1))`, scaled by a
      random factor in [0.5, 1] ("equal jitter"); one successful cycle resets it to
      `interval + jitter * rand`.
    * A version that fails to activate is rejected by the agent's swap (`ModelCache.rejections`)
      and never chosen again by the policy; the next cycle then runs at once (at most
      `MAX_RERUNS` times in a row) so that the version below it serves without waiting a period.
    * One failure, one event: the store failing (`sync_failing`, model "*"), a model's plan
      failing (`sync_failing`, that model), and their ends (`sync_recovered`) are told once each
      (`sync.notices`); reminders only when `remind_after_s` asks for them. The swap that fails
      tells its own failure; a rejected version is only reminded of (`version_rejected`).
    * A version refused for its model signature (`SyncReport.refused`: rejected, never
      installed) is one `signature_refused` event and counts as a rejection for the rerun; one
      installed under "warn" despite a failed check is one `signature_unverified` event.
    * Log lines say what serves after a failure, as the cache records it.
    * `stop` ends the loop at the next wait or after the running cycle, never mid-install.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from model_cache import CacheError, ModelCache
from sync.client import SyncClient, SyncReport
from sync.config import SyncConfig, signature_check, validate
from sync.errors import SyncConfigError, SyncError
from sync.notices import Notice, NoticeKind, Notices, Reminders
from sync.policy import Choice, parse_desired
from sync.stores import open_store

logger = logging.getLogger(__name__)

Activate = Callable[[str, int], Awaitable[object]]
Wait = Callable[[float, asyncio.Event], Awaitable[None]]
#: An event sink's `record(model, version, kind, detail)` (e.g. the agent's `EventTee.record`).
EventRecorder = Callable[[str, int | None, str, Mapping[str, object]], None]

STORE = "*"  # the notice key of the store and its metadata (a model name cannot be "*")
MAX_RERUNS = 3  # cycles run at once in a row after rejections, before the schedule resumes


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to run the next cycle."""

    interval_s: float
    jitter_s: float
    base_s: float = 5.0
    max_s: float = 1800.0

    def delay(self, failures: int, rand: float) -> float:
        """Seconds until the next cycle.

        Args:
            failures: Failed cycles in a row (0 after a success).
            rand: A random number in [0, 1).

        Returns:
            The wait.
        """
        if failures <= 0:
            return self.interval_s + self.jitter_s * rand
        step = min(self.max_s, self.base_s * float(2 ** min(failures - 1, 32)))
        return step * (0.5 + 0.5 * rand)


async def wait_or_stop(delay: float, stop: asyncio.Event) -> None:
    """Wait `delay` seconds, or less when `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except asyncio.TimeoutError:
        return


def build_client(config: SyncConfig, cache: ModelCache) -> SyncClient:
    """Make the sync client a config describes.

    Args:
        config: A validated `[sync]` section.
        cache: The agent's model cache.

    Raises:
        SyncConfigError: Invalid settings or an unreadable trusted root.

    Returns:
        The client.
    """
    validate(config, cache.root)
    assert config.trusted_root is not None
    try:
        root = config.trusted_root.read_bytes()
    except OSError as exc:
        raise SyncConfigError(f"cannot read sync.trusted_root: {exc.strerror}") from None
    return SyncClient(
        open_store(config.source, config.s3),
        cache,
        root,
        config.work_dir or Path(cache.root) / "sync",
        parse_desired(config.desired),
        max_parallel=config.max_parallel,
        max_version_bytes=config.max_version_bytes,
        signatures=signature_check(config),
    )


class Syncer(Protocol):
    """What the loop drives: one cycle of a `SyncClient`."""

    def sync_once(self) -> SyncReport:
        """Run one cycle (see `SyncClient.sync_once`)."""
        ...


@dataclass(frozen=True, slots=True)
class CycleResult:
    """How one cycle went, for the schedule."""

    ok: bool  # metadata refreshed and planned (False: the store or its metadata failed)
    transient: bool = False  # a download failed in transport: retry sooner
    rejected: tuple[tuple[str, int], ...] = ()  # failed to activate here, now rejected
    report: SyncReport | None = None  # what the client did (None: the cycle failed)
    activated: tuple[tuple[str, int], ...] = ()  # (model, version) that serve now
    error: str = ""  # why the cycle failed (ok False)


class SyncLoop:
    """One sync cycle at a time, with the state that spans cycles (see module docstring).

    Args:
        syncer: The sync client.
        cache: The agent's model cache (what serves, what is rejected).
        activate: The agent's hot swap; it rejects a version that fails to load.
        events: Where failures and recoveries are told (default: the cache's event log).
        remind_after_s: Remind of a failure that goes on after this long, then twice as long
            after each reminder (0: never).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        syncer: Syncer,
        cache: ModelCache,
        activate: Activate,
        *,
        events: EventRecorder | None = None,
        remind_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._syncer = syncer
        self._cache = cache
        self._activate = activate
        self._events = events or self._cache_event
        self._clock = clock
        reminders = Reminders(first_s=remind_after_s)
        self._store = Notices(reminders)
        self._models = Notices(reminders)
        self._swaps = Notices()  # failed swaps not rejected: logged once, told by the swap
        self._rejections = Notices(reminders)
        self._choices: dict[str, Choice] = {}
        self._one_at_a_time = asyncio.Lock()  # the schedule's cycles and the fleet's `sync`
        self.failures = 0  # failed cycles in a row

    async def cycle(self, stop: asyncio.Event | None = None) -> CycleResult:
        """Run one cycle: sync, tell what started or stopped failing, activate.

        Args:
            stop: When set, no further activation starts.

        Returns:
            How it went.
        """
        async with self._one_at_a_time:
            return await self._cycle(stop)

    async def _cycle(self, stop: asyncio.Event | None) -> CycleResult:
        try:
            report = await asyncio.to_thread(self._syncer.sync_once)
        except SyncError as exc:
            self.failures += 1
            logger.debug("sync failed (%d in a row): %s", self.failures, exc.message)
            self._tell_store(self._store.observe(self._clock(), {STORE: exc.message}))
            return CycleResult(ok=False, error=exc.message)
        now = self._clock()
        self._tell_store(self._store.observe(now, {}))
        self.failures = self.failures + 1 if report.transient else 0
        self._choices = {c.model: c for c in report.choices}
        errors: dict[str, str] = {}
        for model, reason in report.errors:
            errors[model] = f"{errors[model]}; {reason}" if model in errors else reason
        self._tell_models(self._models.observe(now, errors, scope=lambda k: k != STORE))
        self._tell_signatures(report)
        activated, rejected = await self._activate_all(report, stop)
        rejected += tuple((m, v) for m, v, _why in report.refused)
        try:
            current = {f"{r.model}/{r.version}": r.reason for r in self._cache.rejections.entries()}
        except CacheError as exc:
            logger.error("cannot read the rejected versions: %s", exc.message)
        else:
            for notice in self._rejections.observe(now, current, announce=False):
                model, _sep, version = notice.key.rpartition("/")
                detail = {"reason": notice.reason, "reminder": True}
                self._events(model, int(version), "version_rejected", detail)
        return CycleResult(True, report.transient, rejected, report, activated)

    def state(self) -> dict[str, Any]:
        """The loop's state for telemetry: failing or not, and each model's choice and why."""
        since = self._store.since(STORE)
        return {
            "failing": self._store.failing().get(STORE),
            "failing_for_s": None if since is None else round(self._clock() - since, 1),
            "failed_cycles": self.failures,
            "model_errors": self._models.failing(),
            "serving": {m: {"version": c.version, "why": c.why} for m, c in self._choices.items()},
        }

    async def _activate_all(
        self, report: SyncReport, stop: asyncio.Event | None
    ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
        """Activate what the report says should serve; returns (activated, rejected)."""
        activated: list[tuple[str, int]] = []
        rejected: list[tuple[str, int]] = []
        failed: dict[str, str] = {}
        for model, version in report.activate:
            if stop is not None and stop.is_set():
                break
            choice = self._choices.get(model)
            try:
                await self._activate(model, version)
            except Exception as exc:  # noqa: BLE001 - the agent's errors: keep syncing and serving
                reason = str(getattr(exc, "message", exc))
                serving, is_rejected = await asyncio.to_thread(self._after_failure, model, version)
                if is_rejected:
                    rejected.append((model, version))
                    logger.error(
                        "%s version %d failed: %s; %s; rejected on this device: the sync will "
                        "not activate it again until an operator clears it",
                        model,
                        version,
                        reason,
                        serving,
                    )
                else:
                    failed[f"{model}/{version}"] = f"{reason}; {serving}"
            else:
                activated.append((model, version))
                why = f" ({choice.why})" if choice is not None else ""
                logger.info("now serving %s version %d%s", model, version, why)
        for notice in self._swaps.observe(self._clock(), failed):
            if notice.kind is NoticeKind.STARTED:
                model, _sep, number = notice.key.rpartition("/")
                logger.error(
                    "%s version %s failed: %s (retried next cycle)", model, number, notice.reason
                )
        return tuple(activated), tuple(rejected)

    def _after_failure(self, model: str, version: int) -> tuple[str, bool]:
        """What serves now (as a phrase) and whether the failed version is rejected."""
        try:
            active = self._cache.active_version(model)
            rejected = any(r.version == version for r in self._cache.rejections.entries(model))
        except CacheError as exc:
            return f"the cache cannot say what serves ({exc.message})", False
        serving = (
            "no version serves" if active is None else f"version {active.version} keeps serving"
        )
        return serving, rejected

    def _tell_signatures(self, report: SyncReport) -> None:
        """One event per version whose model signature failed: refused, or installed (warn)."""
        for model, version, why in report.refused:
            logger.error(
                "%s version %d refused: model signature: %s; %s",
                model,
                version,
                why,
                self._after_failure(model, version)[0],
            )
            detail = {"reason": f"model signature refused: {why}", "policy": "require"}
            self._events(model, version, "signature_refused", detail)
        for model, version, why in report.unverified:
            logger.warning(
                "%s version %d installed with a model signature failure: %s", model, version, why
            )
            self._events(model, version, "signature_unverified", {"reason": why, "policy": "warn"})

    def _tell_store(self, notices: list[Notice]) -> None:
        for notice in notices:
            if notice.kind is NoticeKind.ENDED:
                logger.info("sync recovered after %d failed cycle(s)", notice.seen)
                detail: dict[str, object] = {"failed_cycles": notice.seen}
                detail["failed_for_s"] = round(self._clock() - notice.since, 1)
                self._events("*", None, "sync_recovered", detail)
                continue
            logger.warning("sync failing (what serves does not change): %s", notice.reason)
            detail = {"reason": notice.reason, "failed_cycles": notice.seen}
            if notice.kind is NoticeKind.REMINDER:
                detail["reminder"] = True
            self._events("*", None, "sync_failing", detail)

    def _tell_models(self, notices: list[Notice]) -> None:
        for notice in notices:
            if notice.kind is NoticeKind.ENDED:
                logger.info("sync of %s recovered", notice.key)
                self._events(notice.key, None, "sync_recovered", {"failed_cycles": notice.seen})
                continue
            logger.warning("sync of %s failing: %s", notice.key, notice.reason)
            detail: dict[str, object] = {"reason": notice.reason}
            if notice.kind is NoticeKind.REMINDER:
                detail["reminder"] = True
            self._events(notice.key, None, "sync_failing", detail)

    def _cache_event(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        try:
            self._cache.record_event(model, version, kind, dict(detail))
        except CacheError as exc:
            logger.error("cannot record event %s of %s: %s", kind, model, exc.message)


async def run_periodic(
    config: SyncConfig,
    cache: ModelCache,
    activate: Activate,
    stop: asyncio.Event,
    *,
    client: Syncer | None = None,
    events: EventRecorder | None = None,
    wait: Wait = wait_or_stop,
    rand: Callable[[], float] = random.random,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Sync until `stop` is set: one cycle at once, then on the `Backoff` schedule.

    Args:
        config: The `[sync]` section.
        cache: The agent's model cache.
        activate: The agent's hot swap, e.g. `CachedVersions.activate`.
        stop: Set it to end the loop.
        client: Replaces the client built from `config` (tests).
        events: Where sync failures and recoveries are told (e.g. the agent's event sink);
            default: the cache's event log.
        wait: Waits between cycles (injected in tests).
        rand: Random numbers in [0, 1) for jitter (injected in tests).
        clock: Monotonic seconds, for reminders (injected in tests).

    Raises:
        SyncConfigError: Invalid settings (raised before the first cycle).
    """
    loop = SyncLoop(
        client or build_client(config, cache),
        cache,
        activate,
        events=events,
        remind_after_s=config.remind_after_s,
        clock=clock,
    )
    await run_schedule(loop, config, stop, wait=wait, rand=rand)


async def run_schedule(
    loop: SyncLoop,
    config: SyncConfig,
    stop: asyncio.Event,
    *,
    wait: Wait = wait_or_stop,
    rand: Callable[[], float] = random.random,
) -> None:
    """Drive `loop` until `stop` is set: one cycle at once, then on the `Backoff` schedule.

    The agent shares its loop with the fleet's `sync` command and its telemetry; `run_periodic`
    builds one for callers that need nothing else.

    Args:
        loop: The sync loop.
        config: The `[sync]` section (interval, jitter, longest backoff).
        stop: Set it to end the schedule; a cycle in progress finishes.
        wait: Waits between cycles (injected in tests).
        rand: Random numbers in [0, 1) for jitter (injected in tests).
    """
    backoff = Backoff(config.interval_s, config.jitter_s, max_s=config.max_backoff_s)
    reruns = 0
    while not stop.is_set():
        result = await loop.cycle(stop)
        if result.rejected and reruns < MAX_RERUNS:
            reruns += 1  # a version was rejected: choose again now, the model may serve nothing
            logger.info("a version was rejected; syncing again at once")
            continue
        reruns = 0
        delay = backoff.delay(loop.failures, rand())
        logger.debug("next sync in %.1f s", delay)
        await wait(delay, stop)
