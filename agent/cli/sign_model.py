"""`edge-agent sign-model` and `edge-agent verify-model`: OpenSSF Model Signing for a model folder.

    edge-agent sign-model build/resnet --key ml-team.key         # writes build/resnet/model.sig
    edge-agent verify-model build/resnet --trust ml-team.pub

The ML team signs its Triton model folder (config.pbtxt, VERSION/...) with the `model-signing`
library (OMS: a Sigstore bundle over an in-toto statement listing every file's SHA-256); ops then
publishes it (`edge-agent publish`, which puts `model.sig` next to the files in the signed
repository) and devices verify it before installing (`sync/model_signature.py`, the same check
`verify-model` runs here). The folder's name is the model's name: the statement records it.

Modes: a private key (EC P-256/384/521 PEM), or a key with its X.509 certificate and chain
(`--certificate`, `--chain`: offline too). Keyless Sigstore signing needs the network (an OIDC
identity, Fulcio, Rekor) and is refused with one line saying so.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from sync.model_signature import (
    SIGNATURE_NAME,
    bundle_signer,
    parse_trusted_signers,
    verify_signature,
)

EXIT_ERROR = 1
EXIT_USAGE = 2
_GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")  # OMS skips these by default
_CHUNK = 1 << 20


def add_commands(subparsers: Any) -> None:  # argparse's _SubParsersAction is private
    """Add `sign-model` and `verify-model` to the agent's sub-command parser."""
    sign = subparsers.add_parser(
        "sign-model", help="sign a model folder (OpenSSF Model Signing, writes model.sig)"
    )
    sign.add_argument("folder", type=Path, help="Triton model folder; its name is the model's")
    sign.add_argument("--key", type=Path, help="EC private key (PEM)")
    sign.add_argument("--certificate", type=Path, help="the key's X.509 signing certificate")
    sign.add_argument(
        "--chain", type=Path, action="append", default=[], help="intermediate/root certificates"
    )
    sign.add_argument(
        "--keyless", action="store_true", help="Sigstore keyless signing (needs the network)"
    )
    sign.add_argument("--signature", type=Path, help=f"default: FOLDER/{SIGNATURE_NAME}")
    verify = subparsers.add_parser(
        "verify-model", help="check a model folder's OpenSSF model signature"
    )
    verify.add_argument("folder", type=Path)
    verify.add_argument(
        "--trust",
        type=Path,
        action="append",
        required=True,
        metavar="KEY",
        help="a trusted signer: public key (PEM), or CA certificates[#IDENTITY]; repeatable",
    )
    verify.add_argument("--signature", type=Path, help=f"default: FOLDER/{SIGNATURE_NAME}")
    verify.add_argument("--model", help="the model's name (default: the folder's name)")


def run(args: argparse.Namespace) -> int:
    """Run `sign-model` or `verify-model`; errors are one line on stderr.

    Returns:
        0, 1 (the signature is refused, or signing failed) or 2 (bad arguments).
    """
    if args.command == "sign-model":
        return _sign(args)
    return _verify(args)


def _fail(message: str, code: int) -> int:
    print(f"edge-agent: error: {message}", file=sys.stderr)
    return code


def _sign(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if args.keyless:
        return _fail(
            "keyless Sigstore signing needs network access (OIDC identity, Fulcio, Rekor) and is "
            "not available offline; sign with --key",
            EXIT_USAGE,
        )
    if args.key is None:
        return _fail("sign-model needs --key (and --certificate for certificate mode)", EXIT_USAGE)
    if args.chain and args.certificate is None:
        return _fail("--chain goes with --certificate", EXIT_USAGE)
    if not folder.is_dir():
        return _fail(f"{folder} is not a folder", EXIT_USAGE)
    signature = args.signature or folder / SIGNATURE_NAME
    # Imported here: the library (with sigstore behind it) is only needed to sign.
    from model_signing import hashing, signing  # noqa: PLC0415

    config = signing.Config()  # type: ignore[no-untyped-call]
    try:
        if args.certificate is not None:
            config.use_certificate_signer(
                private_key=args.key,
                signing_certificate=args.certificate,
                certificate_chain=args.chain,
            )
        else:
            config.use_elliptic_key_signer(private_key=args.key)
        ignored = _relative(signature, folder)
        config.set_hashing_config(
            hashing.Config().set_ignored_paths(  # type: ignore[no-untyped-call]
                paths=ignored, ignore_git_paths=True
            )
        )
        config.sign(folder, signature)
    except OSError as exc:
        return _fail(f"cannot sign {folder}: {exc.strerror}: {exc.filename}", EXIT_ERROR)
    except (ValueError, TypeError) as exc:  # a key that is not an EC PEM key, a bad password
        return _fail(f"cannot sign {folder}: {exc}", EXIT_ERROR)
    try:
        signer = bundle_signer(signature.read_bytes())
    except ValueError:
        signer = f"certificate {args.certificate}"
    print(f"signed {folder} as {folder.name!r} by {signer}: {signature}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if not folder.is_dir():
        return _fail(f"{folder} is not a folder", EXIT_USAGE)
    signature = args.signature or folder / SIGNATURE_NAME
    try:
        trusted = parse_trusted_signers(f"*={key}" for key in args.trust)
    except ValueError as exc:
        return _fail(str(exc).replace("trusted_model_signers: ", "--trust "), EXIT_USAGE)
    try:
        bundle = signature.read_bytes() if signature.exists() else None
        digests = folder_digests(folder, skip=signature)
    except OSError as exc:
        return _fail(f"cannot read {exc.filename}: {exc.strerror}", EXIT_ERROR)
    model = args.model or folder.resolve().name
    verdict = verify_signature(model, bundle, digests, trusted)
    if not verdict.ok:
        return _fail(f"{folder}: model signature refused: {verdict.reason}", EXIT_ERROR)
    print(f"{folder}: signed by {verdict.signer} ({len(digests)} files verified)")
    return 0


def folder_digests(folder: Path, *, skip: Path | None = None) -> dict[str, str]:
    """SHA-256 of every regular file under `folder`, by path relative to it (as OMS lists them).

    Git metadata (`.git`, `.gitignore`, ...) and `skip` (the signature) are left out, as OMS
    leaves them out when signing.

    Raises:
        OSError: A file cannot be read.
    """
    digests: dict[str, str] = {}
    skipped = skip.resolve() if skip is not None else None
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _GIT_PATHS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name in _GIT_PATHS or path.resolve() == skipped or not path.is_file():
                continue
            sha = hashlib.sha256()
            with path.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    sha.update(chunk)
            digests[path.relative_to(folder).as_posix()] = sha.hexdigest()
    return digests


def _relative(path: Path, folder: Path) -> list[Path]:
    """`[path relative to folder]` when it is inside it (OMS then leaves it out), else []."""
    try:
        return [path.resolve().relative_to(folder.resolve())]
    except ValueError:
        return []
