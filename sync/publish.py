"""The publisher: add a model version to a signed TUF repository on object storage.

    publisher = Publisher(Path("fleet-repo"), open_store("s3://fleet-models/prod"))
    publisher.publish("resnet", 2, Path("build/resnet"))   # config.pbtxt + 2/...
    publisher.publish("resnet", 2, folder, check=folder_check)   # validated before signing
    publisher.resign()                                     # new expiry dates, nothing added

Repository layout on the store (TUF with consistent snapshots):

    metadata/N.root.json          every root version (devices walk the chain)
    metadata/N.targets.json       targets, one file per version
    metadata/N.snapshot.json      snapshot, one file per version
    metadata/timestamp.json       the only mutable object; uploaded last
    targets/MODEL/V/...           target files, named `DIR/SHA256.NAME` (hash-prefixed)

One model version is one set of targets under `MODEL/VERSION/`, each path being the file's path
inside the Triton model folder (`resnet/2/config.pbtxt`, `resnet/2/2/model.onnx`). Each target
carries `custom = {"model", "version", "config_sha256"}`; devices check these against the path
and against the signed config file (`sync/policy.py`).

Model signatures (OpenSSF Model Signing, `sync/model_signature.py`): a `model.sig` bundle at the
top of the source folder is published as the target `MODEL/VERSION/model.sig`, and every target's
custom fields get `model_signature = {"signer", "bundle_sha256", "verified_by_publisher"}`. With
the signers' public keys, the bundle is verified against the version's files before anything is
uploaded; `require_signature` refuses a folder without one.

What a device could not load should not be signed: `publish` takes a `ModelCheck`, a callable
that validates the folder as the agent would load it (config, name, model files). This package
never imports the agent, so the agent's command line passes its check in
(`agent/cli/publish_check.py`); without one, only the folder's structure is checked.

Invariants:
    * A refused check uploads and signs nothing.
    * Target files are uploaded before the metadata that lists them, and `timestamp.json` last,
      so a device never sees metadata naming an object that is not there yet.
    * The local copies in `REPO/metadata/` are written (durably) before uploading; if an upload
      fails, the next publish signs higher version numbers and uploads everything again.
    * A published version is immutable: publishing it again with other content is refused.
    * Every role is signed by all of its keys present in `REPO/keys/`, and never by fewer than its
      threshold (`keys.sign_role` refuses).
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

from model_cache import CacheError
from model_cache.atomic import atomic_write_bytes, ensure_dir
from model_cache.layout import validate_model_name, validate_version
from model_cache.manifest import scan_source
from sync.errors import PublishError
from sync.keys import (
    DEFAULT_EXPIRY,
    Clock,
    Expiry,
    load_signers,
    metadata_dir,
    read_root,
    sign_role,
    utc_now,
)
from sync.model_signature import (
    SIGNATURE_NAME,
    TrustedSigner,
    bundle_signer,
    trusted_for,
    verify_signature,
)
from sync.quantize_fields import publish_custom_fields
from sync.store import ObjectStore

logger = logging.getLogger(__name__)

METADATA_PREFIX = "metadata/"
TARGETS_PREFIX = "targets/"
CONFIG_NAME = "config.pbtxt"

#: Validates `(model, version, source_dir)` before signing: returns notes for the output (what
#: was and was not checked); raises `PublishError` with one line saying why it is refused.
ModelCheck = Callable[[str, int, Path], Sequence[str]]


@dataclass(frozen=True, slots=True)
class PublishReport:
    """What a publish did."""

    model: str | None
    version: int | None
    files: int
    bytes: int
    targets_version: int
    snapshot_version: int
    timestamp_version: int
    unchanged: bool = False
    notes: tuple[str, ...] = ()  # what the model check said (e.g. what it did not check)


def target_key(target: TargetFile) -> str:
    """The store key of a target file: `targets/DIR/SHA256.NAME` (TUF consistent snapshots).

    Args:
        target: A signed target.

    Returns:
        The object key.
    """
    return TARGETS_PREFIX + target.get_prefixed_paths()[0]


class Publisher:
    """Signs and uploads repository updates from a local repository folder.

    Args:
        repo: The folder made by `keys.init_keys` (keys/ and metadata/).
        store: Where devices read the repository.
        expiry: Validity periods of the metadata signed.
        clock: "Now", for expiry dates (injected in tests to make stale metadata).
    """

    def __init__(
        self,
        repo: Path,
        store: ObjectStore,
        *,
        expiry: Expiry = DEFAULT_EXPIRY,
        clock: Clock = utc_now,
    ) -> None:
        self._repo = repo
        self._store = store
        self._expiry = expiry
        self._clock = clock

    def publish(
        self,
        model: str,
        version: int,
        source_dir: Path,
        quantize_report: Path | None = None,
        *,
        check: ModelCheck | None = None,
        require_signature: bool = False,
        signers: Sequence[TrustedSigner] = (),
    ) -> PublishReport:
        """Upload a model version's files and sign targets, snapshot and timestamp.

        Args:
            model: Model name.
            version: Version number; `source_dir/VERSION/` is the version folder.
            source_dir: A Triton model folder with `config.pbtxt` and `VERSION/`.
            quantize_report: An `edge-agent quantize` report whose figures (and digest) are
                signed into every target's custom fields.
            check: Validates the folder before anything is uploaded (see `ModelCheck`).
            require_signature: Refuse a folder without a valid OMS signature (`model.sig`).
            signers: Public keys trusted to sign models (per name pattern): a `model.sig` found
                is verified against them and the version's files; without any, its claimed
                signer is recorded as not verified (and `require_signature` is refused).

        Raises:
            PublishError: A bad source folder, an empty directory (it cannot be a target), a
                folder the check refuses, a missing, invalid or untrusted model signature
                (see above), the version already published with other content, too few keys,
                or a failed upload.

        Returns:
            What was published (`unchanged` when the same content was published already).
        """
        self._check_keys()  # before anything is uploaded
        try:
            validate_model_name(model)
            validate_version(version)
            tree = scan_source(Path(source_dir), version)
        except CacheError as exc:
            raise PublishError(f"cannot publish {source_dir}: {exc}", model=model) from None
        file_dirs = {posixpath.dirname(f.path) for f in tree.files} - {""}
        ancestors = {d for p in file_dirs for d in _ancestors(p)}
        empty = sorted(set(tree.dirs) - ancestors)
        if empty:
            raise PublishError(f"empty directories cannot be published: {', '.join(empty)}")
        notes = tuple(check(model, version, Path(source_dir))) if check is not None else ()
        config = next(f for f in tree.files if f.path == CONFIG_NAME)
        config_sha256 = hashlib.sha256(config.source.read_bytes()).hexdigest()
        custom: dict[str, Any] = {
            "model": model,
            "version": version,
            "config_sha256": config_sha256,
        }
        if quantize_report is not None:
            try:
                custom.update(publish_custom_fields(quantize_report))
            except (ValueError, OSError) as exc:
                raise PublishError(
                    f"quantize report {quantize_report}: {exc}", model=model
                ) from None
        new = {}
        digests = {}  # path in the model folder → SHA-256, as the OMS statement lists them
        for item in tree.files:
            path = f"{model}/{version}/{item.path}"
            info = TargetFile.from_file(path, str(item.source), ["sha256"])
            new[path] = (info, item.source)
            digests[item.path] = info.hashes["sha256"]
        bundle_path = Path(source_dir) / SIGNATURE_NAME
        signature = _signature_fields(
            model, bundle_path, digests, require=require_signature, signers=signers
        )
        if signature is not None:
            custom["model_signature"] = signature
            path = f"{model}/{version}/{SIGNATURE_NAME}"
            new[path] = (TargetFile.from_file(path, str(bundle_path), ["sha256"]), bundle_path)
        for info, _src in new.values():
            info.unrecognized_fields = {"custom": dict(custom)}
        targets_md = self._load("targets", Targets)
        prefix = f"{model}/{version}/"
        old = {p: t for p, t in targets_md.signed.targets.items() if p.startswith(prefix)}
        if old:
            if old == {p: t for p, (t, _src) in new.items()}:
                return self._report(model, version, new, unchanged=True, notes=notes)
            raise PublishError(
                f"version {version} of {model} is already published with other content; "
                "version numbers are immutable: publish a new version",
                model=model,
                version=version,
            )
        for info, source in new.values():
            self._store.put(target_key(info), source)
        targets_md.signed.targets.update({p: t for p, (t, _src) in new.items()})
        self._commit(targets_md)
        logger.info("published %s version %d (%d files)", model, version, len(new))
        return self._report(model, version, new, notes=notes)

    def resign(self) -> PublishReport:
        """Sign and upload new versions of targets, snapshot and timestamp with fresh expiry.

        Needed after a key rotation and before metadata expires; adds nothing.

        Raises:
            PublishError: Too few keys, or a failed write or upload.

        Returns:
            The new metadata versions.
        """
        self._commit(self._load("targets", Targets))
        return self._report(None, None, {})

    def _report(
        self,
        model: str | None,
        version: int | None,
        files: dict[str, tuple[TargetFile, Path]],
        *,
        unchanged: bool = False,
        notes: tuple[str, ...] = (),
    ) -> PublishReport:
        return PublishReport(
            model,
            version,
            len(files),
            sum(t.length for t, _src in files.values()),
            self._load("targets", Targets).signed.version,
            self._load("snapshot", Snapshot).signed.version,
            self._load("timestamp", Timestamp).signed.version,
            unchanged,
            notes,
        )

    def _load(self, role: str, kind: type[Any]) -> Metadata[Any]:
        path = metadata_dir(self._repo) / f"{role}.json"
        try:
            md: Metadata[Any] = Metadata.from_bytes(path.read_bytes())
        except FileNotFoundError:
            return Metadata(kind(version=1, expires=self._clock()))
        except (OSError, ValueError) as exc:
            raise PublishError(f"cannot read {path}: {exc}") from None
        if not isinstance(md.signed, kind):
            raise PublishError(f"{path} is not {role} metadata")
        return md

    def _commit(self, targets_md: Metadata[Targets]) -> None:
        """Sign targets, snapshot and timestamp (versions + 1), save them, then upload."""
        root_md = read_root(self._repo)
        root = root_md.signed
        signers = load_signers(self._repo)
        now = self._clock()
        signed: list[tuple[str, str, bytes]] = []  # (role, store key, bytes)

        targets_md.signed.version = self._next_version(targets_md, "targets")
        targets_md.signed.expires = now + self._expiry.of("targets")
        sign_role(targets_md, "targets", root, signers)
        data = targets_md.to_bytes()
        signed.append(("targets", f"{targets_md.signed.version}.targets.json", data))

        snapshot_md: Metadata[Snapshot] = self._load("snapshot", Snapshot)
        snapshot_md.signed.meta["targets.json"] = _meta(targets_md.signed.version, data)
        snapshot_md.signed.version = self._next_version(snapshot_md, "snapshot")
        snapshot_md.signed.expires = now + self._expiry.of("snapshot")
        sign_role(snapshot_md, "snapshot", root, signers)
        data = snapshot_md.to_bytes()
        signed.append(("snapshot", f"{snapshot_md.signed.version}.snapshot.json", data))

        timestamp_md: Metadata[Timestamp] = self._load("timestamp", Timestamp)
        timestamp_md.signed.snapshot_meta = _meta(snapshot_md.signed.version, data)
        timestamp_md.signed.version = self._next_version(timestamp_md, "timestamp")
        timestamp_md.signed.expires = now + self._expiry.of("timestamp")
        sign_role(timestamp_md, "timestamp", root, signers)
        signed.append(("timestamp", "timestamp.json", timestamp_md.to_bytes()))

        folder = metadata_dir(self._repo)
        try:
            ensure_dir(folder)
            for role, _key, payload in signed:
                atomic_write_bytes(folder / f"{role}.json", payload)
        except OSError as exc:
            raise PublishError(f"cannot write metadata in {folder}: {exc.strerror}") from None
        uploads = [(f"{v}.root.json", _root_bytes(self._repo, v)) for v in _root_versions(root)]
        uploads += [(key, payload) for _role, key, payload in signed]
        for key, payload in uploads:  # timestamp.json last
            self._put_bytes(METADATA_PREFIX + key, payload)

    def _check_keys(self) -> None:
        root = read_root(self._repo).signed
        available = load_signers(self._repo).keys()
        for role in ("targets", "snapshot", "timestamp"):
            have = len(set(root.roles[role].keyids) & available)
            if have < root.roles[role].threshold:
                raise PublishError(
                    f"only {have} of the {root.roles[role].threshold} {role} keys needed are in "
                    f"{self._repo / 'keys'}"
                )

    def _next_version(self, md: Metadata[Any], role: str) -> int:
        """Version 1 for a role never signed before, else one more than the saved one."""
        saved = (metadata_dir(self._repo) / f"{role}.json").exists()
        return int(md.signed.version) + 1 if saved else 1

    def _put_bytes(self, key: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory(prefix="edge-agent-publish-") as tmp:
            path = Path(tmp) / "object"
            path.write_bytes(data)
            self._store.put(key, path)


def _signature_fields(
    model: str,
    bundle_path: Path,
    digests: dict[str, str],
    *,
    require: bool,
    signers: Sequence[TrustedSigner],
) -> dict[str, Any] | None:
    """The `model_signature` custom field for a folder's `model.sig`, or None without one."""
    if require and not signers:
        raise PublishError(
            "requiring a model signature needs the signers' public keys (--model-signer KEY)"
        )
    try:
        bundle = bundle_path.read_bytes()
    except FileNotFoundError:
        if require:
            raise PublishError(
                f"no model signature: {bundle_path} is missing (sign the folder with "
                "`edge-agent sign-model`)",
                model=model,
            ) from None
        return None
    except OSError as exc:
        raise PublishError(f"cannot read {bundle_path}: {exc.strerror}", model=model) from None
    if not signers:
        try:
            claimed = bundle_signer(bundle)
        except ValueError as exc:
            raise PublishError(f"{bundle_path}: {exc}", model=model) from None
        return {
            "signer": claimed,
            "bundle_sha256": hashlib.sha256(bundle).hexdigest(),
            "verified_by_publisher": False,
        }
    verdict = verify_signature(model, bundle, digests, trusted_for(model, signers))
    if not verdict.ok:
        raise PublishError(f"model signature refused: {verdict.reason}", model=model)
    return {
        "signer": verdict.signer,
        "bundle_sha256": verdict.bundle_sha256,
        "verified_by_publisher": True,
    }


def _meta(version: int, data: bytes) -> MetaFile:
    return MetaFile(version, len(data), {"sha256": hashlib.sha256(data).hexdigest()})


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _root_versions(root: Root) -> range:
    return range(1, root.version + 1)


def _root_bytes(repo: Path, version: int) -> bytes:
    path = metadata_dir(repo) / f"{version}.root.json"
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PublishError(f"cannot read {path}: {exc.strerror}") from None
