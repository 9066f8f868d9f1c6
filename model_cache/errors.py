"""The model cache's error tree.

Every failure the cache reports to its callers is a `CacheError`. The leaves say what went wrong,
not how a transport should answer it: `agent/api/http/errors.py` (and the MQTT command replies)
map them to status codes in one table each.

    CacheError
    ├── CorruptBlobError        stored bytes do not match their SHA-256 digest
    ├── VersionNotFoundError    no such model version in the cache
    ├── CacheFullError          the disk budget would be exceeded, or the disk is full (ENOSPC)
    ├── BlobTooLargeError       a stream went past its byte cap
    └── InvalidVersionError     a version folder that cannot be installed or activated

Invariants:
    * Errors carry the model, version and digest they concern as fields (None when unknown), so
      logs and replies can report them without parsing the message.
    * Library and OS errors are translated at the package's edge (`translate_os_error`); a caller
      never has to catch `OSError` or `sqlite3.Error` from a `ModelCache` method.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

#: errno values that mean "no space left": full disk, or a quota reached.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class CacheError(Exception):
    """Base of every error the model cache raises.

    Args:
        message: What went wrong, for a human.
        model: The model concerned, when there is one.
        version: The version concerned, when there is one.
        digest: The SHA-256 digest (hex) concerned, when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        version: int | None = None,
        digest: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.version = version
        self.digest = digest


class CorruptBlobError(CacheError):
    """Bytes on disk, or a stream being stored, do not hash to the digest they must have."""


class VersionNotFoundError(CacheError):
    """The cache holds no such model, or no such version of it (or none to roll back to)."""


class CacheFullError(CacheError):
    """Storing more would go past the disk budget, or the file system reported ENOSPC/EDQUOT.

    Args:
        message: What went wrong.
        needed_bytes: Bytes the operation needed, when known.
        budget_bytes: The configured budget, when the budget (not the disk) is the limit.
        **ids: `model`, `version`, `digest`, as for `CacheError`.
    """

    def __init__(
        self,
        message: str,
        *,
        needed_bytes: int | None = None,
        budget_bytes: int | None = None,
        model: str | None = None,
        version: int | None = None,
        digest: str | None = None,
    ) -> None:
        super().__init__(message, model=model, version=version, digest=digest)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes


class BlobTooLargeError(CacheError):
    """A stream or file went past the byte cap it was stored under; nothing was kept."""


class InvalidVersionError(CacheError):
    """A version that cannot be installed or activated.

    Examples: no `config.pbtxt` or no model file in the source folder, a symlink or a path that
    escapes the folder, a bad model name or version number, a version number already installed
    with different content, or an attempt to activate a version marked failed.
    """


@contextmanager
def translate_os_error(
    action: str,
    *,
    model: str | None = None,
    version: int | None = None,
) -> Iterator[None]:
    """Turn an `OSError` raised inside the block into a `CacheError`.

    ENOSPC and EDQUOT become `CacheFullError`; every other `OSError` becomes a plain
    `CacheError` whose message names the action. Other exceptions pass through untouched (a
    fault-injection hook that raises is a simulated crash and must not be disguised).

    Args:
        action: What was being done, e.g. "store blob" (used in the message).
        model: The model concerned, if any.
        version: The version concerned, if any.

    Raises:
        CacheFullError: The block raised an `OSError` with ENOSPC or EDQUOT.
        CacheError: The block raised any other `OSError`.

    Returns:
        A context manager.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise CacheFullError(
                f"{action}: no space left on the cache file system ({exc.strerror})",
                model=model,
                version=version,
            ) from exc
        raise CacheError(f"{action}: {exc}", model=model, version=version) from exc
