"""The served repository view: generations of symlink trees, switched by one symlink rename.

    repository → views/v00000007                    (swapped with os.replace)
    views/v00000007/MODEL/config.pbtxt → ../../../versions/MODEL/V-D12/config.pbtxt
    views/v00000007/MODEL/V            → ../../../versions/MODEL/V-D12/V

A view serves exactly one version per model (the active one) plus that version's config, in the
Triton layout the agent already reads (`agent.repository.layout.list_models`/`list_versions` follow
the symlinks). Building a view never touches the one being served.

Invariants:
    * A generation is complete and fsynced before `swap` can point `repository` at it; a crash
      during `build` leaves an unreferenced generation that `prune` removes.
    * `repository` is always a symlink once the cache is open, so `os.replace` on it is one
      rename(2): readers see the old generation or the new one.
    * Generation numbers only grow, so "newest" is well defined without a clock.
    * `read` is strict: a view with anything unexpected reads as None ("rebuild me").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from model_cache.atomic import (
    TEMP_PREFIX,
    atomic_symlink,
    ensure_dir,
    fsync_dir,
    remove_tree,
)
from model_cache.errors import CacheError, InvalidVersionError
from model_cache.layout import (
    CONFIG_NAME,
    DIGEST_PREFIX_LENGTH,
    CacheLayout,
    parse_version_dirname,
    parse_view_name,
    view_name,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServedVersion:
    """What a view serves for one model: version number and manifest digest."""

    model: str
    version: int
    digest: str


#: What a view holds, as read back from disk: model → (version, first 12 hex of the digest).
ViewContent = Mapping[str, tuple[int, str]]


class RepositoryView:
    """The `views/` generations and the `repository` symlink of one cache root.

    Args:
        layout: Paths of the cache root.
    """

    def __init__(self, layout: CacheLayout) -> None:
        self._layout = layout
        ensure_dir(layout.views_dir)

    def current_name(self) -> str | None:
        """The generation `repository` points at, or None (missing, foreign or dangling).

        Returns:
            A name such as `v00000007`.
        """
        try:
            target = os.readlink(self._layout.repository)
        except OSError:
            return None
        prefix = "views/"
        name = target[len(prefix) :] if target.startswith(prefix) else ""
        if parse_view_name(name) is None or not self._layout.view_dir(name).is_dir():
            return None
        return name

    def read(self) -> ViewContent | None:
        """What the current generation serves.

        Returns:
            model → (version, digest prefix), or None when there is no current generation or it
            holds anything but well-formed entries pointing at existing version folders.
        """
        name = self.current_name()
        if name is None:
            return None
        content: dict[str, tuple[int, str]] = {}
        for model_dir in sorted(self._layout.view_dir(name).iterdir()):
            served = self._read_model(model_dir)
            if served is None:
                return None
            content[model_dir.name] = served
        return content

    def _read_model(self, model_dir: Path) -> tuple[int, str] | None:
        if model_dir.is_symlink() or not model_dir.is_dir():
            return None
        entries = sorted(p.name for p in model_dir.iterdir())
        if len(entries) != 2 or CONFIG_NAME not in entries:
            return None
        version_name = next(e for e in entries if e != CONFIG_NAME)
        try:
            version_target = os.readlink(model_dir / version_name)
            config_target = os.readlink(model_dir / CONFIG_NAME)
        except OSError:
            return None
        parts = version_target.split("/")
        parsed = parse_version_dirname(parts[-2]) if len(parts) >= 2 else None
        if parsed is None or str(parsed[0]) != version_name:
            return None
        try:
            expected = self._layout.view_targets(model_dir.name, parsed[0], parsed[1])
        except InvalidVersionError:
            return None
        if (config_target, version_target) != expected:
            return None
        if not (model_dir / version_name).is_dir() or not (model_dir / CONFIG_NAME).is_file():
            return None
        return parsed

    def matches(self, served: Iterable[ServedVersion]) -> bool:
        """Whether the current generation serves exactly `served`.

        Args:
            served: One entry per model that should be served.

        Returns:
            True when the view on disk serves these versions and nothing else.
        """
        wanted = {s.model: (s.version, s.digest[:DIGEST_PREFIX_LENGTH]) for s in served}
        return self.read() == wanted

    def build(self, served: Iterable[ServedVersion]) -> str:
        """Build a new, complete generation (not yet served).

        Args:
            served: One entry per model to serve; the version folders must exist.

        Raises:
            OSError: A directory or symlink cannot be created; the partial generation is
                removed.

        Returns:
            The new generation's name, to pass to `swap`.
        """
        name = view_name(self._newest_generation() + 1)
        root = self._layout.view_dir(name)
        root.mkdir()
        try:
            for entry in sorted(served, key=lambda s: s.model):
                model_dir = root / entry.model
                model_dir.mkdir()
                config_target, version_target = self._layout.view_targets(
                    entry.model, entry.version, entry.digest
                )
                os.symlink(config_target, model_dir / CONFIG_NAME)
                os.symlink(version_target, model_dir / str(entry.version))
                fsync_dir(model_dir)
            fsync_dir(root)
            fsync_dir(root.parent)
        except BaseException:
            remove_tree(root)
            raise
        return name

    def swap(self, name: str) -> None:
        """Point `repository` at a built generation, atomically and durably.

        Args:
            name: A generation returned by `build`.

        Raises:
            CacheError: `repository` exists and is not a symlink (someone replaced it).
            OSError: The rename failed.
        """
        link = self._layout.repository
        if link.exists() and not link.is_symlink():
            raise CacheError(f"{link} is not a symlink; refusing to replace it")
        atomic_symlink(self._layout.repository_target(name), link)
        logger.info("Serving view %s", name)

    def prune(self, keep: int = 2) -> int:
        """Remove old generations: keep the current one and the newest others up to `keep`.

        Keeping the previous generation lets a reader that resolved `repository` just before a
        swap finish its lookups. Recovery passes `keep=1`.

        Args:
            keep: How many generations to keep, the current one included (at least 1).

        Returns:
            How many entries were removed (generations and leftover temp entries).
        """
        current = self.current_name()
        names = sorted(
            (p.name for p in self._layout.views_dir.iterdir() if parse_view_name(p.name)),
            key=lambda n: parse_view_name(n) or 0,
            reverse=True,
        )
        kept = {current} if current else set()
        for name in names:
            if len(kept) >= max(keep, 1):
                break
            kept.add(name)
        removed = 0
        for path in sorted(self._layout.views_dir.iterdir()):
            if path.name not in kept:
                removed += remove_tree(path)
        for path in self._layout.root.glob(f"{TEMP_PREFIX}*"):
            removed += remove_tree(path)
        return removed

    def discard(self, name: str) -> None:
        """Remove a generation that was built but will not be served.

        Args:
            name: The generation.

        Raises:
            CacheError: `name` is the current generation.
        """
        if name == self.current_name():
            raise CacheError(f"view {name} is being served")
        remove_tree(self._layout.view_dir(name))

    def _newest_generation(self) -> int:
        numbers = [parse_view_name(p.name) for p in self._layout.views_dir.iterdir()]
        return max((n for n in numbers if n is not None), default=0)
