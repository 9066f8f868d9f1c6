"""The sync package's error tree.

Every failure `sync` reports to its callers is a `SyncError`. Like python-tuf's own tree
(`tuf.api.exceptions`), there are two roots of meaning: data that arrived and is wrong
(`VerificationError`: refuse it, never retry it blindly) and transport that failed
(`DownloadError`: retry later with backoff). Leaves say what went wrong, never how a transport
should answer it.

    SyncError
    ├── VerificationError       untrusted data is wrong: nothing of it is used
    │   ├── MetadataError       TUF metadata refused: bad or missing signatures, below the
    │   │                       threshold, expired (freeze), older version (rollback)
    │   ├── TargetError         a downloaded file does not match its signed length or SHA-256
    │   └── UnsafeTargetError   signed targets that break our rules: `..` or absolute paths,
    │                           inconsistent custom fields, a version not signed at all
    ├── DownloadError           the object store failed: unreachable, missing object, cut off
    │   └── NotFoundError       the store has no such object
    ├── InstallError            the model cache refused a verified version
    │   └── DiskFullError       no room: disk full (ENOSPC) or over the cache's budget
    ├── PublishError            the publisher cannot build or sign a repository update
    │   └── KeyFileError        a key file is missing, unreadable or too permissive
    └── SyncConfigError         invalid `[sync]` settings

Invariants:
    * Library errors (python-tuf, boto3, urllib3, OSError, `CacheError`) are translated at the
      package's edge; callers of `sync` never need to catch them.
    * Errors carry the model, version and target path they concern as fields (None when
      unknown), so logs and replies report them without parsing the message.
    * No message ever contains private key material.
"""

from __future__ import annotations


class SyncError(Exception):
    """Base of every error the sync package raises.

    Args:
        message: What went wrong, for a human.
        model: The model concerned, when there is one.
        version: The version concerned, when there is one.
        path: The TUF target path or store key concerned, when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        version: int | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.version = version
        self.path = path


class VerificationError(SyncError):
    """Untrusted data failed verification; it was not used."""


class MetadataError(VerificationError):
    """TUF metadata was refused (signatures, threshold, expiry, rollback, format)."""


class TargetError(VerificationError):
    """A downloaded target does not match the length or hash its signed metadata gives."""


class UnsafeTargetError(VerificationError):
    """Signed targets break the device's rules (paths, custom fields, version contents)."""


class DownloadError(SyncError):
    """The object store could not deliver: unreachable, cut off, or an error response."""


class NotFoundError(DownloadError):
    """The object store has no object under that key."""


class InstallError(SyncError):
    """The model cache refused to install a verified version."""


class DiskFullError(InstallError):
    """No room for a version: the disk is full or the cache's budget would be exceeded."""


class PublishError(SyncError):
    """The publisher cannot build, sign or upload a repository update."""


class KeyFileError(PublishError):
    """A signing key file is missing, unreadable, malformed or readable by others."""


class SyncConfigError(SyncError):
    """Invalid `[sync]` settings."""
