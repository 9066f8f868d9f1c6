"""Model control on the data plane: the repository index, explicit load / unload (from the
repository or from files sent with the request), and hot-swaps between the versions a model
cache holds (activate, rollback, lifting rejections).

A part of `DataPlane`, the transports' one facade, which hands it what it needs when it is made
and passes the API layer's calls on. A change runs to its end even when its caller goes away
(`_to_completion`), and drops the model's response-cache entries once it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from agent.errors import ModelControlDisabledError, ModelControlError, ModelNotFoundError
from agent.models.cache_control import CachedVersions
from agent.models.control import ModelControlMode, ModelManager
from agent.models.pushed import PushedModels, parse_file_parameters
from agent.models.registry import ModelRegistry
from agent.repository.model_config import config_from_json
from agent.serving.client_text import PathScrubber
from agent.serving.response_cache import ResponseCache

T = TypeVar("T")


class ModelControl:
    """The model-control operations of the data plane."""

    def __init__(
        self,
        registry: ModelRegistry,
        manager: ModelManager,
        *,
        cache: ResponseCache | None,
        mode: ModelControlMode,
        versions: CachedVersions | None,
        pushed: PushedModels | None,
        max_request_bytes: int,
        scrub: PathScrubber,
    ) -> None:
        self._registry = registry
        self._cache = cache
        self._max_request_bytes = max_request_bytes
        self._scrub = scrub
        self._changes: set[asyncio.Future[Any]] = set()  # model-control changes under way
        self.manager = manager  # replaceable: the daemon wires one that reports its events
        self.mode = mode
        self.versions = versions  # the model cache's versions (None: a plain repository)
        self.pushed = pushed  # None: loads with request files are refused

    def repository_index(
        self, ready_only: bool = False, *, detailed: bool = False
    ) -> list[dict[str, str]]:
        """The repository index as Triton answers it (`triton_rows`); `detailed`: with the
        agent's reasons for models whose config failed (the status page's rows)."""
        rows = _with_rejections(self._registry.index(), self.rejected_versions())
        rows = [{k: self._scrub(v) if k == "reason" else v for k, v in r.items()} for r in rows]
        if ready_only:
            rows = [r for r in rows if r.get("state") == "READY"]
        return rows if detailed else triton_rows(rows)

    async def load_model(
        self,
        name: str,
        config: dict[str, Any] | None,
        files: Mapping[str, bytes] | None = None,
    ) -> str:
        """Explicit load (or reload) of a model, with an optional JSON config override.

        With `files` (Triton's `file:<path>` parameters, decoded), the model is loaded from
        those files and the config, not from the repository (see `agent.models.pushed`).

        Raises:
            ModelControlError: the agent is not in explicit model-control mode.
            InvalidInputError: files without a config, or a path outside the model folder.
            ModelConfigError: the override is not a valid config.
            ModelNotFoundError, ModelLoadError: as `ModelManager.load`.
        """
        self._require_explicit("load")
        return await self._to_completion(self._load_model(name, config, files))

    async def _load_model(
        self,
        name: str,
        config: dict[str, Any] | None,
        files: Mapping[str, bytes] | None,
    ) -> str:
        pushed = parse_file_parameters(
            files or {}, has_config=config is not None, max_bytes=self._max_request_bytes
        )
        override = config_from_json(config) if config is not None else None
        if pushed is not None:
            if self.pushed is None:
                raise ModelControlError("this agent does not load models from request files")
            assert override is not None  # parse_file_parameters requires the config
            strategy = await self.pushed.load(self.manager, name, override, pushed)
        else:
            strategy = await self.manager.load(name, override)
            if self.pushed is not None:  # served from the repository again
                await self.pushed.forget(name)
        if self._cache is not None:
            self._cache.invalidate(name)
        return strategy

    async def unload_model(self, name: str) -> None:
        """Explicit unload; queued requests finish first (a pushed model's files are removed)."""
        self._require_explicit("unload")
        await self._to_completion(self._unload_model(name))

    async def _unload_model(self, name: str) -> None:
        try:
            await self.manager.unload(name)
        except ModelNotFoundError:
            return  # as Triton: nothing is served under that name, so the unload is done

        if self.pushed is not None:
            await self.pushed.forget(name)
        if self._cache is not None:
            self._cache.invalidate(name)

    async def activate_version(self, name: str, version: int) -> str:
        """Hot-swap a model to a version the cache holds (lifting its rejection); the strategy."""
        cached = self._cached()

        async def activate() -> str:
            strategy = await cached.activate(name, version, operator=True)
            if self._cache is not None:
                self._cache.invalidate(name)
            return strategy

        return await self._to_completion(activate())

    async def rollback(self, name: str, to_version: int | None) -> int:
        """Go back to a retained version (by default the previous one); returns it."""
        cached = self._cached()

        async def roll_back() -> int:
            version = await cached.rollback(name, to_version)
            if self._cache is not None:
                self._cache.invalidate(name)
            return version

        return await self._to_completion(roll_back())

    async def _to_completion(self, change: Coroutine[Any, Any, T]) -> T:
        """Run a model-control change to its end even if its caller is cancelled (an HTTP
        client or gRPC call that went away): a half-done load or swap helps nobody."""
        task = asyncio.ensure_future(change)
        self._changes.add(task)
        task.add_done_callback(self._changes.discard)
        return await asyncio.shield(task)

    def cached_versions(self, name: str) -> list[dict[str, Any]]:
        return self._cached().versions(name)

    async def clear_rejected(self, name: str, version: int | None, *, by: str) -> list[int]:
        """Let the sync activate a model's rejected versions again; returns those lifted."""
        cached = self._cached()
        return await asyncio.to_thread(cached.clear_rejected, name, version, by=by)

    def rejected_versions(self) -> list[dict[str, Any]]:
        """Versions rejected on this device, with cause and reason ([] without a cache)."""
        return self.versions.rejected() if self.versions is not None else []

    def _cached(self) -> CachedVersions:
        if self.versions is None:
            raise ModelControlError(
                "the agent serves a plain repository: versions are activated and rolled back "
                "only with a model cache (--cache-dir)"
            )
        return self.versions

    def _require_explicit(self, action: str) -> None:
        if self.mode is not ModelControlMode.EXPLICIT:
            raise ModelControlDisabledError(  # Triton's words, whatever the mode
                "explicit model load / unload is not allowed if polling is enabled "
                f"(model-control mode '{self.mode.value}': {action} needs "
                "--model-control-mode explicit)"
            )


def triton_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Index rows in Triton's shape: no empty reason, and a model with no version (its config
    failed before any version was read) as its name alone; the reason is in the metadata."""
    return [
        {"name": r["name"]}
        if "version" not in r
        else {k: v for k, v in r.items() if k != "reason" or v}
        for r in rows
    ]


def _with_rejections(
    rows: list[dict[str, str]], rejected: list[dict[str, Any]]
) -> list[dict[str, str]]:
    """The repository index with each rejected version's reason (and a row if it had none)."""
    if not rejected:
        return rows
    by_key = {(str(r["model"]), str(r["version"])): r for r in rejected}
    out: list[dict[str, str]] = []
    for row in rows:
        found = by_key.pop((row["name"], row.get("version", "")), None)
        if found is None:
            out.append(row)
            continue
        note = f"rejected on this device ({found['cause']}: {found['reason']})"
        out.append({**row, "reason": f"{row['reason']}; {note}" if row.get("reason") else note})
    for (name, version), found in sorted(by_key.items()):
        note = f"rejected on this device ({found['cause']}: {found['reason']})"
        out.append({"name": name, "version": version, "state": "UNAVAILABLE", "reason": note})
    return sorted(out, key=lambda r: (r["name"], int(r.get("version") or 0)))
