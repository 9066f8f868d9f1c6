"""The `keys`, `publish` and `sync` sub-commands' arguments (cheap to import: no boto3, no tuf).

`sync.cli.run` carries them out; the agent's CLI imports that only when one of them is given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sync.roles import ROLES

__all__ = ["EXIT_CONFIG", "EXIT_ERROR", "SYNC_COMMANDS", "add_commands"]

SYNC_COMMANDS = frozenset({"keys", "publish", "sync"})
EXIT_ERROR = 1
EXIT_CONFIG = 2


def add_commands(subparsers: Any) -> None:  # argparse's _SubParsersAction is private
    """Add `keys`, `publish` and `sync` to the agent's sub-command parser.

    Args:
        subparsers: What `ArgumentParser.add_subparsers(dest="command")` returned.
    """
    keys = subparsers.add_parser("keys", help="signing keys of a model repository (publisher)")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    init = keys_commands.add_parser("init", help="create keys and root metadata")
    init.add_argument("--repo", type=Path, required=True, help="repository folder to create")
    for role in ROLES:
        init.add_argument(f"--{role}-keys", type=int, default=1, metavar="N")
        init.add_argument(f"--{role}-threshold", type=int, default=1, metavar="N")
    rotate = keys_commands.add_parser("rotate", help="add/remove keys of a role (new root)")
    rotate.add_argument("--repo", type=Path, required=True)
    rotate.add_argument("--role", choices=ROLES, required=True)
    rotate.add_argument("--add", type=int, default=1, help="new keys to create (default 1)")
    rotate.add_argument("--remove", action="append", default=[], metavar="KEYID")
    rotate.add_argument("--threshold", type=int)

    publish = subparsers.add_parser("publish", help="sign and upload a model version")
    publish.add_argument("--repo", type=Path, required=True, help="folder made by keys init")
    publish.add_argument("--store", required=True, help="s3://bucket/prefix or file:///folder")
    publish.add_argument("--create-bucket", action="store_true", help="s3: create it if missing")
    publish.add_argument(
        "--quantize-report",
        type=Path,
        help="sign this `edge-agent quantize` report's figures into the version's metadata",
    )
    publish.add_argument(
        "--no-verify-model",
        action="store_true",
        help="do not load the model files before signing (no ONNX Runtime here); the config "
        "is still checked",
    )
    publish.add_argument(
        "--require-model-signature",
        action="store_true",
        help="refuse a folder without a valid OpenSSF model signature (SOURCE/model.sig); "
        "also `require_model_signature = true` in REPO/publish.toml",
    )
    publish.add_argument(
        "--model-signer",
        action="append",
        default=[],
        metavar="[PATTERN=]KEY",
        help="a public key trusted to sign models (matching PATTERN, default *); repeatable; "
        "adds to `model_signers` in REPO/publish.toml",
    )
    _s3_flags(publish)
    publish.add_argument("model", nargs="?", help="omit all three to re-sign (new expiry)")
    publish.add_argument("version", nargs="?", type=int)
    publish.add_argument("source", nargs="?", type=Path, help="Triton model folder")

    sync = subparsers.add_parser("sync", help="fetch signed model versions into the cache")
    sync.add_argument("--once", action="store_true", required=True, help="one cycle, then exit")
    # `section.key` destinations: the agent's config loader applies them over the file and the
    # EDGE_AGENT_* environment, exactly as for `serve`.
    sync.add_argument("--config", type=Path, help="agent TOML file ([sync], [cache] dir)")
    sync.add_argument(
        "--source", dest="sync.source", help="s3://, http(s):// or file:/// repository URL"
    )
    sync.add_argument(
        "--trusted-root",
        type=Path,
        dest="sync.trusted_root",
        help="the root.json shipped to the device",
    )
    sync.add_argument("--cache-dir", type=Path, dest="cache.dir")
    sync.add_argument("--desired", action="append", dest="sync.desired", metavar="MODEL=POLICY")
    sync.add_argument("--no-activate", action="store_true", help="install, do not serve")
    sync.add_argument("--s3-endpoint", dest="sync.s3_endpoint", help="e.g. http://127.0.0.1:5000")
    sync.add_argument("--s3-region", dest="sync.s3_region")


def _s3_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3-endpoint", help="e.g. http://127.0.0.1:5000 (default: AWS)")
    parser.add_argument("--s3-region")
