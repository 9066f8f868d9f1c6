"""Raise the soft open-file limit to the hard one at start-up, as servers do.

Every connection holds a file descriptor; a soft limit of 1024 (a common default) would let a
thousand idle clients make accept() fail for everyone, and model loads fail to open files. The
hard limit is what the administrator allows; the connection cap (`server.max_connections`) keeps
the agent's own use below it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_CEILING = 1 << 20  # an "unlimited" hard limit: Linux refuses more than fs.nr_open (2**20)


def raise_open_file_limit() -> tuple[int, int] | None:
    """Set RLIMIT_NOFILE's soft limit to its hard limit; returns (old soft, new soft), or None
    where there is no such limit (not POSIX) or it cannot be changed (left as it was)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft >= target:
        return (soft, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return None
    logger.info("open-file limit raised from %d to %d", soft, target)
    return (soft, target)
