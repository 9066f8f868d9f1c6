"""Transport for python-tuf and for target files, over an `ObjectStore`.

Two pieces, both thin:

* `StoreFetcher` is python-tuf's `FetcherInterface` (one method, `_fetch`): the ngclient
  `Updater` downloads metadata through it, and python-tuf itself enforces the metadata length
  caps of `UpdaterConfig` (`download_bytes(url, max_length)`).
* `Downloader` streams one target file into a `.part` file on disk: bounded memory (one chunk at
  a time), a hard cap at the signed length (an endless or longer object is cut off at
  `length + 1` bytes), and resumption with a range request from the bytes already on disk, both
  within one call (the connection broke) and across calls (the process was stopped).

Neither decides trust. The `.part` file is only ever used after python-tuf's
`TargetFile.verify_length_and_hashes` accepted the whole file (`sync/client.py`); a file that
fails is deleted, so a resumed prefix can never smuggle bytes in.

Invariants:
    * Never more than `length` bytes are kept on disk for a target; the moment the store sends
      more, the part file is deleted and `TargetError` is raised.
    * A part file longer than the signed length (e.g. left by an older signed version with the
      same path) is discarded before resuming; part files are named by the signed SHA-256, so a
      prefix is only resumed towards the content it was started for.
    * Resumption is bounded: `max_resumes` consecutive failures without progress end the call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote

from tuf.api import exceptions as tuf_exceptions
from tuf.ngclient import FetcherInterface

from sync.errors import DownloadError, NotFoundError, TargetError
from sync.store import ObjectStore

logger = logging.getLogger(__name__)

#: Opens a part file for appending; injected by tests to simulate a full disk.
PartOpener = Callable[[Path], BinaryIO]


def open_for_append(path: Path) -> BinaryIO:
    """Open (creating if needed, mode 0600) a part file for appending.

    Args:
        path: The part file.

    Raises:
        OSError: It cannot be opened.

    Returns:
        A binary file positioned at its end.
    """
    return path.open("ab")


class StoreFetcher(FetcherInterface):
    """python-tuf's fetcher over an `ObjectStore`; URLs are `store.url + key`.

    Args:
        store: Where the repository lives.
    """

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def _fetch(self, url: str) -> Iterator[bytes]:
        """Stream the object a URL under the store's base URL names.

        Args:
            url: `store.url` followed by a key.

        Raises:
            tuf.api.exceptions.DownloadHTTPError: No such object (status 404, which ngclient
                reads as "no newer root").
            tuf.api.exceptions.DownloadError: A URL outside the store, or a transport failure.

        Returns:
            The object's chunks.
        """
        base = self._store.url
        if not url.startswith(base):
            raise tuf_exceptions.DownloadError(f"{url} is outside the store {base}")
        key = unquote(url[len(base) :])
        try:
            return self._store.get(key)
        except NotFoundError as exc:
            raise tuf_exceptions.DownloadHTTPError(exc.message, 404) from None
        except DownloadError as exc:
            raise tuf_exceptions.DownloadError(exc.message) from None


class Downloader:
    """Resumable, length-capped downloads of target files into part files.

    Args:
        store: Where target files live.
        max_resumes: Consecutive failed attempts (without new bytes) before giving up.
        retry_delay_s: Pause before the first resume; doubles with each further failure.
        open_part: Opens a part file for appending (injected to simulate write failures).
        sleep: Pauses between resumes (injected in tests).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        max_resumes: int = 4,
        retry_delay_s: float = 0.5,
        open_part: PartOpener = open_for_append,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._max_resumes = max_resumes
        self._delay = retry_delay_s
        self._open = open_part
        self._sleep = sleep

    def download(self, key: str, part: Path, length: int, on_bytes: Callable[[int], None]) -> int:
        """Bring `part` to exactly `length` bytes from the object `key`, resuming what is there.

        Args:
            key: Object key of the target file.
            part: The part file (may hold a prefix from an earlier attempt).
            length: The signed length: the most bytes accepted.
            on_bytes: Called with the size of each chunk written (progress).

        Raises:
            TargetError: The object is longer or shorter than `length` (the part is deleted).
            NotFoundError: No such object.
            DownloadError: The transfer failed `max_resumes` times in a row.
            OSError: The part file cannot be written (e.g. ENOSPC); the caller cleans up.

        Returns:
            How many bytes were already on disk before this call (resumed from).
        """
        have = part.stat().st_size if part.exists() else 0
        if have > length:
            logger.info("discarding part file %s: %d bytes, signed length %d", part, have, length)
            part.unlink()
            have = 0
        resumed_from = have
        failures = 0
        while have < length:
            try:
                got = self._stream(key, part, have, length, on_bytes)
            except NotFoundError:
                raise
            except DownloadError as exc:
                size = part.stat().st_size if part.exists() else 0
                failures = 0 if size > have else failures + 1
                have = size
                if failures > self._max_resumes:
                    raise DownloadError(
                        f"{key}: gave up after {failures} failed attempts: {exc.message}",
                        path=key,
                    ) from None
                logger.info("download of %s broke off at %d/%d bytes: resuming", key, size, length)
                self._sleep(self._delay * 2 ** max(0, failures - 1))
                continue
            if got == 0:
                part.unlink(missing_ok=True)
                raise TargetError(
                    f"{key}: the object ends at {have} bytes; its signed length is {length}",
                    path=key,
                )
            have += got
        return resumed_from

    def _stream(
        self, key: str, part: Path, offset: int, length: int, on_bytes: Callable[[int], None]
    ) -> int:
        written = 0
        chunks = self._store.get(key, offset)
        try:
            with self._open(part) as out:
                for chunk in chunks:
                    if offset + written + len(chunk) > length:
                        out.close()
                        part.unlink(missing_ok=True)
                        raise TargetError(
                            f"{key}: the object is longer than its signed length {length}; "
                            "download stopped",
                            path=key,
                        )
                    out.write(chunk)
                    written += len(chunk)
                    on_bytes(len(chunk))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return written
