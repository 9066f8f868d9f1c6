"""`SyncConfig`: the agent's `[sync]` section, read once at start-up and passed explicitly.

    [sync]
    source = "s3://fleet-models/prod"        # "" (default): no sync
    trusted_root = "root.json"                # shipped with the device; relative to the file
    desired = ["*=latest", "resnet=3"]        # per model: latest | N | N,M,...
    interval_s = 300
    jitter_s = 30
    remind_after_s = 0                        # a failure is told once; N: remind after N s, 2N...
    s3_endpoint = "http://127.0.0.1:5000"     # "" : AWS; credentials from the environment
    s3_region = ""
    model_signature_policy = "require"        # off (default) | warn | require
    trusted_model_signers = ["resnet*=/etc/edge-agent/ml-team.pub"]   # PATTERN=PUBLIC_KEY

Field types are those the agent's config loader knows (str, int, tuple[str, ...], Path | None):
it reads this section like its own, from the file, the environment and flags, for `serve` and
`sync --once` alike. `validate` checks what the types cannot.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sync.errors import SyncConfigError
from sync.model_signature import (
    SignatureCheck,
    SignaturePolicy,
    parse_policy,
    parse_trusted_signers,
)
from sync.policy import parse_desired

if TYPE_CHECKING:
    from sync.store import S3Settings  # urllib3 and the cache's writer: only for a sync


@dataclass(frozen=True, slots=True)
class SyncConfig:
    """Where signed model versions come from, which ones to hold, and how often to look."""

    source: str = ""  # s3://bucket/prefix, https://host/path, file:///folder; "": sync off
    trusted_root: Path | None = None  # the root.json shipped with the device
    desired: tuple[str, ...] = ("*=latest",)  # MODEL=latest | MODEL=N | MODEL=N,M; * = any
    interval_s: int = 300  # between successful cycles
    jitter_s: int = 30  # up to this much is added, so a fleet does not sync in lockstep
    max_backoff_s: int = 1800  # longest wait after repeated failures
    remind_after_s: int = 0  # a failure goes on: remind after this, then 2x, 4x... (0: never)
    s3_endpoint: str = ""  # e.g. http://127.0.0.1:5000 (moto_server, MinIO); "": AWS
    s3_region: str = ""  # "": AWS_DEFAULT_REGION / ~/.aws/config
    max_parallel: int = 3  # target files downloaded at once
    max_version_bytes: int = 8 * 1024**3  # refuse bigger versions before downloading
    work_dir: Path | None = None  # metadata, part files, staging; default CACHE_DIR/sync
    model_signature_policy: str = "off"  # OMS signatures: off | warn | require
    trusted_model_signers: tuple[str, ...] = ()  # PATTERN=PUBLIC_KEY_FILE | PATTERN=CA_FILE#ID

    @property
    def enabled(self) -> bool:
        """Whether a source is configured."""
        return bool(self.source)

    @property
    def s3(self) -> S3Settings:
        """S3 endpoint and region settings."""
        from sync.store import S3Settings  # noqa: PLC0415 - see the imports

        return S3Settings(endpoint_url=self.s3_endpoint, region=self.s3_region)


def validate(config: SyncConfig, cache_dir: Path | None) -> None:
    """Check a config beyond its types (call at start-up: bad config fails at boot).

    Args:
        config: The `[sync]` section.
        cache_dir: The agent's `cache.dir` (sync installs into the cache).

    Raises:
        SyncConfigError: What is wrong, naming the key.
    """
    if not config.enabled:
        return
    if cache_dir is None:
        raise SyncConfigError("sync.source needs cache.dir: versions are installed into the cache")
    if config.trusted_root is None or not config.trusted_root.is_file():
        raise SyncConfigError(
            f"sync.trusted_root must name the repository's root.json, got {config.trusted_root}"
        )
    if not config.source.startswith(("s3://", "https://", "http://", "file:///")):
        raise SyncConfigError(
            f"sync.source must be s3://, http(s):// or file:///, got {config.source!r}"
        )
    if config.interval_s < 1 or config.jitter_s < 0 or config.max_backoff_s < 1:
        raise SyncConfigError("sync.interval_s and max_backoff_s must be >= 1, jitter_s >= 0")
    if config.remind_after_s < 0:
        raise SyncConfigError("sync.remind_after_s must be >= 0 (0: no reminders)")
    if not 1 <= config.max_parallel <= 32:
        raise SyncConfigError("sync.max_parallel must be 1..32")
    if config.max_version_bytes < 1:
        raise SyncConfigError("sync.max_version_bytes must be >= 1")
    if config.source.startswith("s3://"):
        need_extra("boto3", "s3", 'sync.source = "s3://..."')
    parse_desired(config.desired)
    check = signature_check(config)
    if check.policy is not SignaturePolicy.OFF:
        need_extra("model_signing", "signing", "sync.model_signature_policy")


def need_extra(module: str, extra: str, feature: str) -> None:
    """Refuse a feature whose pip extra is not installed, naming the fix (as the agent's own
    `agent.config.extras`, which sync/ does not import).

    Raises:
        SyncConfigError: `module` cannot be imported; the message names `extra`.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SyncConfigError(
            f"{feature} needs the {extra} extra ({module} is not installed): "
            f"pip install 'edge-agent[{extra}]'"
        )


def signature_check(config: SyncConfig) -> SignatureCheck:
    """The OMS policy and trusted keys a config describes (the key files are read here).

    Args:
        config: The `[sync]` section.

    Raises:
        SyncConfigError: A bad policy or entry, an unreadable key, or `require` without keys.

    Returns:
        What `SyncClient` checks each version's model signature with.
    """
    try:
        policy = parse_policy(config.model_signature_policy)
        trusted = parse_trusted_signers(config.trusted_model_signers)
    except ValueError as exc:
        raise SyncConfigError(f"sync.{exc}") from None
    if policy is SignaturePolicy.REQUIRE and not trusted:
        raise SyncConfigError(
            'sync.model_signature_policy = "require" needs sync.trusted_model_signers'
        )
    return SignatureCheck(policy, trusted)
