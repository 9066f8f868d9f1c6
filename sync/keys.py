"""Signing keys and root metadata of a publisher's repository folder.

    REPO/keys/ROLE-KEYID12.pem     Ed25519 private keys, PKCS#8 PEM, mode 0600 (folder 0700)
    REPO/keys/retired/             keys taken out of root by a rotation (destroy them)
    REPO/metadata/N.root.json      every root version; `root.json` is the newest: ship it to
                                   devices as their trusted root (`sync.trusted_root`)

    init_keys(repo, {"root": RoleSpec(2, 2), "targets": RoleSpec(2, 2)})   # 2 keys, threshold 2
    rotate_keys(repo, "root", add=1, remove=old_ids)                      # root v2, TUF rules

Invariants:
    * A key file is created with O_EXCL at mode 0600 and never overwritten; a key file that group
      or others can read is refused when loaded (as ssh does). Private key bytes are never
      logged, printed or put into an error message; only key ids are.
    * A new root version is written only after python-tuf confirmed that it is signed by a
      threshold of the previous root's keys *and* of its own keys (spec 5.3.4), i.e. exactly
      what a device will check. Root versions are written durably (fsync, rename, fsync dir).
    * Which key signs for which role is decided by root metadata (key ids), not by file names.
"""

from __future__ import annotations

import datetime
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner, Signer
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root

from model_cache.atomic import atomic_write_bytes, durable_rename, ensure_dir
from sync.errors import KeyFileError, PublishError
from sync.roles import ROLES

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    """The current time, UTC, whole seconds (TUF expiry has second precision)."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """How many keys a role gets and how many of them must sign."""

    keys: int = 1
    threshold: int = 1


@dataclass(frozen=True, slots=True)
class Expiry:
    """How long each role's metadata stays valid after signing; devices refuse it after."""

    root_days: int = 365
    targets_days: int = 90
    snapshot_days: int = 30
    timestamp_days: int = 7

    def of(self, role: str) -> datetime.timedelta:
        """The validity period of `role`'s metadata."""
        return datetime.timedelta(days=int(getattr(self, f"{role}_days")))


DEFAULT_EXPIRY = Expiry()


def keys_dir(repo: Path) -> Path:
    """`REPO/keys`."""
    return repo / "keys"


def metadata_dir(repo: Path) -> Path:
    """`REPO/metadata`."""
    return repo / "metadata"


def generate_key(repo: Path, role: str) -> CryptoSigner:
    """Create an Ed25519 key and store its private half in `REPO/keys/` (0600, never replaced).

    Args:
        repo: The repository folder.
        role: The role it is made for (only used in the file name).

    Raises:
        KeyFileError: The file cannot be written.

    Returns:
        The signer (its `public_key.keyid` identifies it in root metadata).
    """
    signer = CryptoSigner.generate_ed25519()
    folder = keys_dir(repo)
    path = folder / f"{role}-{signer.public_key.keyid[:12]}.pem"
    try:
        ensure_dir(folder)
        folder.chmod(0o700)
        if path.exists():
            raise KeyFileError(f"key file {path} already exists")
        atomic_write_bytes(path, signer.private_bytes, mode=0o600)
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror}") from None
    logger.info("created %s key %s", role, signer.public_key.keyid)
    return signer


def load_signers(repo: Path) -> dict[str, Signer]:
    """Every private key in `REPO/keys/`, by key id.

    Raises:
        KeyFileError: A key file is readable by group or others, unreadable or not a key.

    Returns:
        key id → signer.
    """
    signers: dict[str, Signer] = {}
    folder = keys_dir(repo)
    for path in sorted(folder.glob("*.pem")) if folder.is_dir() else []:
        try:
            mode = path.stat().st_mode
            if stat.S_IMODE(mode) & 0o077:
                raise KeyFileError(
                    f"key file {path} is accessible by others (mode {stat.S_IMODE(mode):o}); "
                    "run chmod 600 on it"
                )
            private = load_pem_private_key(path.read_bytes(), None)
            signer = CryptoSigner(private)
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
        except (ValueError, TypeError):
            raise KeyFileError(f"{path} is not an unencrypted PKCS#8 Ed25519 key") from None
        signers[signer.public_key.keyid] = signer
    return signers


def sign_role(md: Metadata[Any], role: str, root: Root, signers: Mapping[str, Signer]) -> int:
    """Replace `md`'s signatures with those of every available key of `role` in `root`.

    Args:
        md: The metadata to sign.
        role: Whose keys sign.
        root: The root that names the role's keys and threshold.
        signers: Available private keys by key id.

    Raises:
        PublishError: Fewer keys available than the role's threshold (nothing would verify).

    Returns:
        How many signatures were made.
    """
    keyids = [k for k in root.roles[role].keyids if k in signers]
    threshold = root.roles[role].threshold
    if len(keyids) < threshold:
        raise PublishError(
            f"only {len(keyids)} of the {threshold} {role} keys needed are in the keys folder"
        )
    md.signatures.clear()
    for keyid in keyids:
        md.sign(signers[keyid], append=True)
    return len(keyids)


def write_root(repo: Path, md: Metadata[Root]) -> Path:
    """Write `N.root.json` and `root.json` durably.

    Raises:
        PublishError: The files cannot be written.

    Returns:
        The path of `root.json`.
    """
    folder = metadata_dir(repo)
    data = md.to_bytes()
    try:
        ensure_dir(folder)
        atomic_write_bytes(folder / f"{md.signed.version}.root.json", data)
        atomic_write_bytes(folder / "root.json", data)
    except OSError as exc:
        raise PublishError(f"cannot write root metadata in {folder}: {exc.strerror}") from None
    return folder / "root.json"


def read_root(repo: Path) -> Metadata[Root]:
    """The newest root of the repository folder.

    Raises:
        PublishError: No root yet (run `edge-agent keys init`) or it cannot be parsed.

    Returns:
        The root metadata.
    """
    path = metadata_dir(repo) / "root.json"
    try:
        return Metadata[Root].from_bytes(path.read_bytes())
    except FileNotFoundError:
        raise PublishError(f"no {path}: run `edge-agent keys init` first") from None
    except (OSError, ValueError) as exc:
        raise PublishError(f"cannot read {path}: {exc}") from None


def init_keys(
    repo: Path,
    roles: Mapping[str, RoleSpec],
    *,
    expiry: Expiry = DEFAULT_EXPIRY,
    clock: Clock = utc_now,
) -> Metadata[Root]:
    """Create the keys of every role and root version 1 (consistent snapshots on).

    Args:
        repo: The repository folder (created; must not hold a root yet).
        roles: Keys and threshold per role; roles not given get one key, threshold 1.
        expiry: Validity of root metadata.
        clock: "Now", for the expiry date.

    Raises:
        PublishError: A root exists already, a threshold exceeds the key count, or a file
            cannot be written.

    Returns:
        Root version 1, signed.
    """
    if (metadata_dir(repo) / "root.json").exists():
        raise PublishError(f"{repo} already has a root; use `edge-agent keys rotate`")
    root = Root(expires=clock() + expiry.of("root"), consistent_snapshot=True)
    for role in ROLES:
        spec = roles.get(role, RoleSpec())
        if not 1 <= spec.threshold <= spec.keys:
            raise PublishError(f"{role}: threshold {spec.threshold} needs 1..{spec.keys} keys")
        for _ in range(spec.keys):
            root.add_key(generate_key(repo, role).public_key, role)
        root.roles[role].threshold = spec.threshold
    md = Metadata(root)
    sign_role(md, "root", root, load_signers(repo))
    write_root(repo, md)
    return md


def rotate_keys(
    repo: Path,
    role: str,
    *,
    add: int = 1,
    remove: tuple[str, ...] = (),
    threshold: int | None = None,
    expiry: Expiry = DEFAULT_EXPIRY,
    clock: Clock = utc_now,
) -> Metadata[Root]:
    """Make the next root version with keys of `role` added and removed (TUF key rotation).

    The new root is signed by the previous root's root keys and by its own; removed keys'
    files move to `keys/retired/`. After rotating a non-root role, publish again
    (`edge-agent publish` without a model re-signs everything).

    Args:
        repo: The repository folder.
        role: One of `ROLES`.
        add: New keys to create for the role.
        remove: Key ids (or unique prefixes) to take out of the role.
        threshold: The role's new threshold (default: unchanged).
        expiry: Validity of the new root.
        clock: "Now", for the expiry date.

    Raises:
        PublishError: Unknown role or key id, a threshold the keys cannot meet, or too few
            private keys to satisfy the old or the new root.

    Returns:
        The new root, signed.
    """
    if role not in ROLES:
        raise PublishError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    previous = read_root(repo)
    md = Metadata[Root].from_bytes(previous.to_bytes())
    root = md.signed
    retired: list[str] = []
    for prefix in remove:
        matches = [k for k in root.roles[role].keyids if k.startswith(prefix)]
        if len(matches) != 1:
            raise PublishError(f"{prefix!r} names {len(matches)} {role} keys, not one")
        root.revoke_key(matches[0], role)
        retired.append(matches[0])
    for _ in range(add):
        root.add_key(generate_key(repo, role).public_key, role)
    if threshold is not None:
        root.roles[role].threshold = threshold
    count = len(root.roles[role].keyids)
    if not 1 <= root.roles[role].threshold <= count:
        raise PublishError(f"{role}: threshold {root.roles[role].threshold} with {count} keys")
    root.version += 1
    root.expires = clock() + expiry.of("root")
    signers = load_signers(repo)
    wanted = set(previous.signed.roles["root"].keyids) | set(root.roles["root"].keyids)
    md.signatures.clear()
    for keyid in sorted(wanted & signers.keys()):
        md.sign(signers[keyid], append=True)
    try:  # exactly the checks a device makes (spec 5.3.4): old threshold, then new threshold
        previous.signed.verify_delegate("root", md.signed_bytes, md.signatures)
        root.verify_delegate("root", md.signed_bytes, md.signatures)
    except UnsignedMetadataError as exc:
        raise PublishError(f"new root would not verify on devices: {exc}") from None
    write_root(repo, md)
    _retire(repo, retired)
    logger.info("root version %d: rotated %s keys", root.version, role)
    return md


def _retire(repo: Path, keyids: list[str]) -> None:
    folder = keys_dir(repo)
    for path in sorted(folder.glob("*.pem")):
        if any(path.stem.endswith(k[:12]) for k in keyids):
            ensure_dir(folder / "retired")
            durable_rename(path, folder / "retired" / path.name)
            os.chmod(folder / "retired", 0o700)
