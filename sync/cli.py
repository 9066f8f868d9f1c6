"""Command line: `edge-agent keys init|rotate`, `edge-agent publish`, `edge-agent sync --once`.

Wired into `agent/cli/commands.py` with two calls: `add_commands(subparsers)` while building the
parser and `run(args)` when `args.command in SYNC_COMMANDS`. Thin: parse, call the package, print.
Key material is never printed; only key ids and paths are.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from model_cache import CacheError, ModelCache
from sync.cli_parser import EXIT_CONFIG, EXIT_ERROR
from sync.client import SyncClient, activate_in_cache
from sync.config import SyncConfig, signature_check, validate
from sync.errors import SyncConfigError, SyncError
from sync.keys import RoleSpec, init_keys, rotate_keys
from sync.model_signature import TrustedSigner, parse_trusted_signers
from sync.policy import parse_desired
from sync.publish import ModelCheck, Publisher
from sync.roles import ROLES
from sync.store import S3Settings
from sync.stores import open_store
from sync.target_downloads import Progress

PUBLISH_SETTINGS = "publish.toml"  # in the repository folder: the publisher's own settings


def run(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    check: ModelCheck | None = None,
) -> int:
    """Run a `keys` or `publish` command (`sync --once` is `sync_once`, after the config is read).

    Args:
        args: Parsed arguments (`args.command` is `keys` or `publish`).
        out: Where results go (default stdout).
        err: Where errors and the progress bar go (default stderr).
        check: `publish` validates the model folder with it before signing (the agent's CLI
            passes one: this package does not import the agent).

    Returns:
        The exit code: 0, 1 (an operation failed) or 2 (bad configuration).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "keys":
            return _keys(args, out)
        return _publish(args, out, check)
    except SyncConfigError as exc:
        print(f"edge-agent: error: {exc.message}", file=err)
        return EXIT_CONFIG
    except (SyncError, CacheError) as exc:
        print(f"edge-agent: error: {exc}", file=err)
        return EXIT_ERROR


def _keys(args: argparse.Namespace, out: TextIO) -> int:
    if args.keys_command == "init":
        specs = {
            r: RoleSpec(getattr(args, f"{r}_keys"), getattr(args, f"{r}_threshold")) for r in ROLES
        }
        md = init_keys(args.repo, specs)
    else:
        md = rotate_keys(
            args.repo, args.role, add=args.add, remove=tuple(args.remove), threshold=args.threshold
        )
    root = md.signed
    print(f"root version {root.version} in {args.repo / 'metadata' / 'root.json'}", file=out)
    for role in ROLES:
        ids = ", ".join(k[:12] for k in root.roles[role].keyids)
        print(f"  {role}: threshold {root.roles[role].threshold} of [{ids}]", file=out)
    print("private keys are in", args.repo / "keys", "(mode 0600): keep them offline", file=out)
    return 0


def _publish(args: argparse.Namespace, out: TextIO, check: ModelCheck | None) -> int:
    given = [a is not None for a in (args.model, args.version, args.source)]
    if any(given) and not all(given):
        raise SyncConfigError("publish needs MODEL VERSION SOURCE (or none of them to re-sign)")
    store = open_store(args.store, S3Settings(args.s3_endpoint or "", args.s3_region or ""))
    if args.create_bucket:
        ensure = getattr(store, "ensure_bucket", None)
        if ensure is None:
            raise SyncConfigError("--create-bucket is for s3:// stores")
        ensure()
    publisher = Publisher(args.repo, store)
    require, signers = publish_settings(
        args.repo, args.require_model_signature, tuple(args.model_signer)
    )
    if args.model is None:
        report = publisher.resign()
        print(f"re-signed: targets v{report.targets_version}", end="", file=out)
    else:
        report = publisher.publish(
            args.model,
            args.version,
            args.source,
            args.quantize_report,
            check=check,
            require_signature=require,
            signers=signers,
        )
        for note in report.notes:
            print(f"{args.model} version {args.version}: {note}", file=out)
        state = "already published" if report.unchanged else "published"
        print(
            f"{args.model} version {args.version}: {state} ({report.files} files, "
            f"{report.bytes} bytes), targets v{report.targets_version}",
            end="",
            file=out,
        )
    print(f", snapshot v{report.snapshot_version}, timestamp v{report.timestamp_version}", file=out)
    return 0


def publish_settings(
    repo: Path, require: bool, signers: tuple[str, ...]
) -> tuple[bool, tuple[TrustedSigner, ...]]:
    """The model-signature settings of a publish: `REPO/publish.toml`'s `[publish]`, plus flags.

        [publish]
        require_model_signature = true
        model_signers = ["resnet*=ml-team.pub"]   # [PATTERN=]KEY, relative to REPO

    Args:
        repo: The repository folder.
        require: `--require-model-signature` (only ever turns the requirement on).
        signers: `--model-signer` values (relative to the working directory).

    Raises:
        SyncConfigError: An unreadable or malformed file, or a bad key.

    Returns:
        Whether a signature is required, and the trusted keys.
    """
    path = repo / PUBLISH_SETTINGS
    section: dict[str, object] = {}
    if path.is_file():
        try:
            section = tomllib.loads(path.read_text()).get("publish", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SyncConfigError(f"{path}: {exc}") from None
    unknown = set(section) - {"require_model_signature", "model_signers"}
    if unknown:
        raise SyncConfigError(f"{path}: unknown [publish] key(s) {', '.join(sorted(unknown))}")
    in_file = section.get("require_model_signature", False)
    listed = section.get("model_signers", [])
    if not isinstance(in_file, bool) or not (
        isinstance(listed, list) and all(isinstance(e, str) for e in listed)
    ):
        raise SyncConfigError(
            f"{path}: require_model_signature must be true/false, model_signers a list of strings"
        )
    entries = [_signer_entry(e, repo) for e in listed] + [_signer_entry(e, None) for e in signers]
    try:
        return require or in_file, parse_trusted_signers(entries)
    except ValueError as exc:
        raise SyncConfigError(str(exc).replace("trusted_model_signers", "model signer")) from None


def _signer_entry(entry: str, base: Path | None) -> str:
    pattern, sep, key = entry.rpartition("=")
    key_path = Path(key.strip())
    if base is not None and not key_path.is_absolute():
        key_path = base / key_path
    return f"{pattern if sep else '*'}={key_path}"


def sync_once(
    config: SyncConfig,
    cache_dir: Path | None,
    *,
    activate: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """`edge-agent sync --once`: one sync cycle into the cache, then exit.

    Args:
        config: The `[sync]` section as the agent's loader read it (file, environment, flags).
        cache_dir: The agent's `cache.dir`.
        activate: Serve what the cycle installed (the cache's active version), or only install.
        out: Where results go (default stdout).
        err: Where errors and the progress bar go (default stderr).

    Returns:
        The exit code: 0, 1 (an operation failed) or 2 (bad configuration).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        return _sync(config, cache_dir, activate, out, err)
    except SyncConfigError as exc:
        print(f"edge-agent: error: {exc.message}", file=err)
        return EXIT_CONFIG
    except (SyncError, CacheError) as exc:
        print(f"edge-agent: error: {exc}", file=err)
        return EXIT_ERROR


def _sync(
    config: SyncConfig, cache_dir: Path | None, activate: bool, out: TextIO, err: TextIO
) -> int:
    if not config.enabled:
        raise SyncConfigError("no repository: pass --source URL or set sync.source")
    validate(config, cache_dir)
    assert config.trusted_root is not None
    assert cache_dir is not None
    bar = ProgressBar(err)
    with ModelCache(cache_dir) as cache:
        client = SyncClient(
            open_store(config.source, config.s3),
            cache,
            config.trusted_root.read_bytes(),
            config.work_dir or cache.root / "sync",
            parse_desired(config.desired),
            max_parallel=config.max_parallel,
            max_version_bytes=config.max_version_bytes,
            progress=bar.update,
            signatures=signature_check(config),
        )
        report = client.sync_once()
        bar.finish()
        failures = activate_in_cache(cache, report.activate) if activate else []
    for model, version in report.installed:
        print(f"installed {model} version {version}", file=out)
    if activate:
        for model, version in report.activate:
            print(f"serving {model} version {version}", file=out)
    for model, version, why in report.unverified:
        print(f"edge-agent: warning: {model} version {version}: model signature: {why}", file=err)
    refused = [f"{m} version {v}: model signature refused: {r}" for m, v, r in report.refused]
    for message in [f"{m}: {r}" for m, r in report.errors] + refused + failures:
        print(f"edge-agent: error: {message}", file=err)
    if not (report.installed or report.activate or report.errors or refused):
        print("up to date", file=out)
    return EXIT_ERROR if report.errors or refused or failures else 0


class ProgressBar:
    """A one-line download bar on a terminal (at most 10 redraws a second)."""

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self._stream = stream
        self._width = width
        self._start = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, progress: Progress) -> None:
        """Redraw for `progress` (called from download threads)."""
        now = time.monotonic()
        if now - self._last < 0.1 and progress.done_bytes < progress.total_bytes:
            return
        self._last = now
        total = max(progress.total_bytes, 1)
        filled = self._width * progress.done_bytes // total
        rate = progress.done_bytes / max(now - self._start, 1e-6) / 2**20
        self._stream.write(
            f"\r[{'#' * filled}{'.' * (self._width - filled)}] "
            f"{100 * progress.done_bytes // total:3d}% "
            f"{progress.done_bytes / 2**20:.1f}/{progress.total_bytes / 2**20:.1f} MiB "
            f"{rate:.1f} MiB/s"
        )
        self._stream.flush()
        self._shown = True

    def finish(self) -> None:
        """End the bar's line, if one was drawn."""
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
