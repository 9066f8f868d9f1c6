"""Pure rules: what a signed model version must look like, and which ones this device holds.

Security review reads this file and `sync/keys.py`. Everything here is a pure function of
*verified* TUF targets (python-tuf has already checked signatures, thresholds, expiry and
rollback), the desired state and the cache's state; there is no I/O and no clock.

    signed = group_targets(verified_targets)               # UnsafeTargetError on any bad entry
    desired = parse_desired(("*=latest", "resnet=3"))      # per model: latest, pinned or a list
    todo = plan(signed, desired, cached, rejected)          # what to fetch, what to activate

Rules for signed targets (all or nothing: one bad entry refuses the whole target set, since
signed garbage means a broken or compromised publisher):
    * A path is `MODEL/VERSION/REST`: a valid model name, a decimal version, and REST either
      `config.pbtxt`, `model.sig` (the version's OMS signature bundle, checked by
      `sync/model_signature.py` and never installed) or a relative path inside `VERSION/` with no
      empty, `.` or `..` segment, no backslash and no leading `/`. Nothing can be written outside
      the version's folder.
    * `custom.model` and `custom.version` equal the path's; every target of a version carries
      the same `custom.config_sha256`, and it is the signed SHA-256 of that version's
      `config.pbtxt` (so a config swapped in without re-signing is caught twice: here, and by
      its hash at download).
    * A version's expected cache digest (`SignedVersion.manifest_digest`) is computed from the
      signed paths, sizes and hashes; a cached version with another digest is not the signed one.

Desired state:
    * `latest`: the highest signed version. `N`: exactly version N. `N,M,...`: hold all of them,
      serve the highest. `*=...` applies to every signed model without an entry of its own.
    * A version the policy names but the publisher did not sign is never fetched or activated.

Rejected versions (failed to load here, or rolled back from by an operator; the cache keeps
them until an operator clears them):
    * are never fetched or activated by the sync;
    * `latest` means the newest signed version that is not rejected: when the newest is
      rejected, the one below it is served (fetched first if the cache lacks it), so a model is
      never left without a version while a signed one that may load exists;
    * a rejection holds one version only: a newer signed version is chosen as usual;
    * `N` and `N,M,...` never fall back to unnamed versions: a pinned version that is rejected
      is an error of that model, and a list serves its highest version not rejected.
    Each model's choice comes with why (`Choice.why`), for logs, events and status.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: python-tuf (with boto3 behind it) loads when syncing
    from tuf.api.metadata import TargetFile

from model_cache import CacheError
from model_cache.layout import validate_model_name, validate_relpath, validate_version
from model_cache.manifest import Manifest, ManifestEntry
from sync.errors import SyncConfigError, UnsafeTargetError
from sync.model_signature import SIGNATURE_NAME

CONFIG_NAME = "config.pbtxt"
WILDCARD = "*"


class Kind(enum.Enum):
    """How a model's versions are chosen."""

    LATEST = "latest"
    PINNED = "pinned"
    LIST = "list"


@dataclass(frozen=True, slots=True)
class Desired:
    """One model's version policy."""

    kind: Kind
    versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SignedFile:
    """One verified target of a version: where it goes and what it must be."""

    rel: str  # path inside the Triton model folder: config.pbtxt or VERSION/...
    target: TargetFile


@dataclass(frozen=True, slots=True)
class SignedVersion:
    """A model version exactly as the publisher signed it."""

    model: str
    version: int
    config_sha256: str
    files: tuple[SignedFile, ...]  # what the cache installs (the OMS bundle is not one of them)
    signature: SignedFile | None = None  # the OMS bundle (`model.sig`), when one was published

    @property
    def total_bytes(self) -> int:
        """Sum of the files' signed lengths (with the OMS bundle)."""
        bundle = self.signature.target.length if self.signature is not None else 0
        return sum(f.target.length for f in self.files) + bundle

    @property
    def downloads(self) -> tuple[SignedFile, ...]:
        """Every target to download: the files, then the OMS bundle if there is one."""
        return self.files + ((self.signature,) if self.signature is not None else ())

    @property
    def manifest_digest(self) -> str:
        """The digest `ModelCache` will give this content (its manifest's SHA-256)."""
        entries = [
            ManifestEntry(f.rel, f.target.hashes["sha256"], f.target.length) for f in self.files
        ]
        dirs = {d for f in self.files for d in _parents(f.rel)}
        return Manifest.build(self.model, self.version, sorted(dirs), entries).digest


@dataclass(frozen=True, slots=True)
class CachedVersion:
    """What the cache holds of one version (failed versions are left out by the caller)."""

    version: int
    digest: str
    active: bool


@dataclass(frozen=True, slots=True)
class Choice:
    """The version the policy serves for one model, and why that one."""

    model: str
    version: int
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of `plan`: versions to download and install, versions to serve, refusals."""

    fetch: tuple[SignedVersion, ...]
    activate: tuple[tuple[str, int], ...]
    errors: tuple[tuple[str, str], ...]  # (model, reason)
    choices: tuple[Choice, ...] = ()  # per model with a servable version, in model order


def parse_desired(entries: Iterable[str]) -> dict[str, Desired]:
    """Parse `MODEL=latest`, `MODEL=N` and `MODEL=N,M,...` entries (`*` for every model).

    Args:
        entries: The config's `sync.desired` list.

    Raises:
        SyncConfigError: A malformed entry, a bad model name or version, or a model twice.

    Returns:
        model (or `*`) → policy.
    """
    desired: dict[str, Desired] = {}
    for entry in entries:
        model, sep, spec = (part.strip() for part in entry.partition("="))
        if not sep or not model or not spec:
            raise SyncConfigError(f"sync.desired entry {entry!r} must be MODEL=POLICY")
        try:
            if model != WILDCARD:
                validate_model_name(model)
            if spec == "latest":
                policy = Desired(Kind.LATEST)
            else:
                versions = tuple(sorted({validate_version(int(v)) for v in spec.split(",")}))
                policy = Desired(Kind.PINNED if len(versions) == 1 else Kind.LIST, versions)
        except (CacheError, ValueError):
            raise SyncConfigError(
                f"sync.desired entry {entry!r}: want MODEL=latest, MODEL=N or MODEL=N,M,..."
            ) from None
        if model in desired:
            raise SyncConfigError(f"sync.desired names {model!r} twice")
        desired[model] = policy
    return desired


def group_targets(targets: Mapping[str, TargetFile]) -> dict[tuple[str, int], SignedVersion]:
    """Check every verified target against the rules above and group them by model version.

    Args:
        targets: Target path → verified `TargetFile` (from python-tuf).

    Raises:
        UnsafeTargetError: Any target breaks a rule; the message names it.

    Returns:
        (model, version) → the signed version.
    """
    grouped: dict[tuple[str, int], list[tuple[SignedFile, str]]] = {}
    for path, info in sorted(targets.items()):
        model, version, rel = _split(path)
        custom = info.custom
        if (
            not isinstance(custom, dict)
            or custom.get("model") != model
            or (custom.get("version") != version)
        ):
            raise UnsafeTargetError(
                f"target {path!r}: custom model/version do not match its path",
                model=model,
                version=version,
                path=path,
            )
        config = custom.get("config_sha256")
        if not isinstance(config, str) or "sha256" not in info.hashes:
            raise UnsafeTargetError(
                f"target {path!r}: no SHA-256 or config digest", model=model, path=path
            )
        grouped.setdefault((model, version), []).append((SignedFile(rel, info), config))
    result: dict[tuple[str, int], SignedVersion] = {}
    for (model, version), items in grouped.items():
        configs = {c for _f, c in items}
        config_file = [f for f, _c in items if f.rel == CONFIG_NAME]
        if not config_file:
            raise UnsafeTargetError(
                f"{model} version {version}: no signed {CONFIG_NAME}", model=model, version=version
            )
        signed_config = config_file[0].target.hashes["sha256"]
        if configs != {signed_config}:
            raise UnsafeTargetError(
                f"{model} version {version}: config digests in custom fields do not match the "
                f"signed {CONFIG_NAME}",
                model=model,
                version=version,
            )
        bundle = next((f for f, _c in items if f.rel == SIGNATURE_NAME), None)
        files = tuple(
            sorted(
                (f for f, _c in items if f.rel != SIGNATURE_NAME),
                key=lambda f: (f.rel != CONFIG_NAME, f.rel),
            )
        )
        result[(model, version)] = SignedVersion(model, version, signed_config, files, bundle)
    return result


def plan(
    signed: Mapping[tuple[str, int], SignedVersion],
    desired: Mapping[str, Desired],
    cached: Mapping[str, Iterable[CachedVersion]],
    rejected: Mapping[str, Mapping[int, str]] | None = None,
) -> Plan:
    """Decide what to download and what to serve.

    Args:
        signed: Verified versions (`group_targets`).
        desired: Per-model policy (`parse_desired`).
        cached: Per model, the versions the cache holds in a usable state.
        rejected: Per model, the versions rejected on this device → why (see module docstring).

    Returns:
        The plan: versions to fetch (not cached yet), (model, version) pairs to activate (not
        active yet), per-model refusals (e.g. a pinned version that is not signed, or every
        candidate rejected), and each served model's choice with its reason.
    """
    by_model: dict[str, dict[int, SignedVersion]] = {}
    for (model, version), item in signed.items():
        by_model.setdefault(model, {})[version] = item
    models = {m for m in desired if m != WILDCARD}
    if WILDCARD in desired:
        models |= set(by_model)
    fetch: list[SignedVersion] = []
    activate: list[tuple[str, int]] = []
    errors: list[tuple[str, str]] = []
    choices: list[Choice] = []
    for model in sorted(models):
        policy = desired.get(model) or desired[WILDCARD]
        available = by_model.get(model, {})
        if not available:
            errors.append((model, f"no signed version of {model} in the repository"))
            continue
        if policy.kind is not Kind.LATEST:
            unsigned = [v for v in policy.versions if v not in available]
            if unsigned:
                errors.append(
                    (
                        model,
                        f"version(s) {unsigned} of {model} are not in the signed "
                        "targets; refusing them",
                    )
                )
                continue
        picked = choose(model, policy, sorted(available), (rejected or {}).get(model, {}))
        if isinstance(picked, str):
            errors.append((model, picked))
            continue
        wanted, choice = picked
        have = {c.version: c for c in cached.get(model, ())}
        conflict = [
            v for v in wanted if v in have and have[v].digest != available[v].manifest_digest
        ]
        if conflict:
            errors.append(
                (
                    model,
                    f"the cache holds version(s) {conflict} of {model} with "
                    "content that is not the signed one; evict them first",
                )
            )
            continue
        fetch.extend(available[v] for v in wanted if v not in have)
        choices.append(choice)
        if not (choice.version in have and have[choice.version].active):
            activate.append((model, choice.version))
    return Plan(tuple(fetch), tuple(activate), tuple(errors), tuple(choices))


def choose(
    model: str, policy: Desired, signed: Sequence[int], rejected: Mapping[int, str]
) -> tuple[tuple[int, ...], Choice] | str:
    """The versions to hold and the one to serve, skipping rejected versions.

    Args:
        model: Model name (for messages).
        policy: The model's policy; the versions it names are signed.
        signed: The model's signed version numbers, ascending (at least one).
        rejected: The model's rejected versions → why.

    Returns:
        (versions to hold, the choice), or why nothing can be served.
    """
    newest = signed[-1]
    if policy.kind is Kind.LATEST:
        candidates = [v for v in signed if v not in rejected]
        if not candidates:
            return (
                f"every signed version of {model} is rejected on this device (newest, "
                f"{newest}: {rejected[newest]}); clear a rejection to serve it"
            )
        serve = candidates[-1]
        why = "the newest signed version"
        if serve != newest:
            skipped = [v for v in signed if v > serve]
            why = (
                f"the newest signed version not rejected on this device (version(s) {skipped} "
                f"rejected; {skipped[-1]}: {rejected[skipped[-1]]})"
            )
        return (serve,), Choice(model, serve, why)
    held = tuple(v for v in policy.versions if v not in rejected)
    refused = [v for v in policy.versions if v in rejected]
    if not held:
        return (
            f"version(s) {refused} of {model} are rejected on this device "
            f"({refused[-1]}: {rejected[refused[-1]]}); clear the rejection to serve it"
        )
    why = "pinned" if policy.kind is Kind.PINNED else "the highest version of the list"
    if refused:
        why += f" not rejected on this device (version(s) {refused} rejected)"
    return held, Choice(model, max(held), why)


def _split(path: str) -> tuple[str, int, str]:
    model, sep1, rest = path.partition("/")
    number, sep2, rel = rest.partition("/")
    try:
        if not (sep1 and sep2) or not number.isdigit() or number != str(int(number)):
            raise ValueError("want MODEL/VERSION/PATH")
        version = validate_version(int(number))
        validate_model_name(model)
        if (
            path.startswith("/")
            or "\\" in path
            or any(s in ("", ".", "..") for s in path.split("/"))
        ):
            raise ValueError("empty, '.' or '..' segment, backslash or absolute path")
        if rel not in (CONFIG_NAME, SIGNATURE_NAME):
            validate_relpath(rel)
            if not rel.startswith(f"{version}/"):
                raise ValueError(
                    f"not {CONFIG_NAME}, not {SIGNATURE_NAME} and not inside {version}/"
                )
    except (CacheError, ValueError) as exc:
        message = exc.message if isinstance(exc, CacheError) else str(exc)
        raise UnsafeTargetError(f"unsafe target path {path!r}: {message}", path=path) from None
    return model, version, rel


def _parents(rel: str) -> list[str]:
    if rel in (CONFIG_NAME, SIGNATURE_NAME):
        return []
    parts = posixpath.dirname(rel).split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
