"""Who signed each version this device installed, as `GET .../versions`, status and events show.

    store = ProvenanceStore(work_dir / "provenance")
    store.record(Provenance("resnet", 3, signer="key sha256:...", verified=True, ...))
    store.get("resnet", 3)      # Provenance | None
    store.signer("resnet", 3)   # "key sha256:..." or ""

The sync writes one small JSON file per installed version (`provenance/MODEL/VERSION.json`) when
it installs it, from the OMS check it made (`sync/model_signature.py`) and what the publisher
signed into the version's TUF custom fields. The agent reads them to report a version's signer.

Invariants:
    * A record is written (durably, atomically) before the version is installed into the cache,
      so a version the cache holds never lacks one because of a crash; a record whose install
      then failed names a version the cache does not hold, and is simply never asked for.
    * Reading never raises: a missing or unreadable record is "no record" (logged at debug).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from model_cache.atomic import atomic_write_bytes, ensure_dir
from model_cache.layout import validate_model_name, validate_version

logger = logging.getLogger(__name__)

_MAX_RECORD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Provenance:
    """A version's model signature as this device found it when installing it."""

    model: str
    version: int
    signer: str = ""  # `key sha256:HEX`: verified on this device, else as the publisher recorded
    bundle_sha256: str = ""  # the OMS bundle's digest ("" when none was published)
    verified: bool = False  # this device verified the signature against a trusted key
    policy: str = "off"  # the device's `sync.model_signature_policy` at install
    reason: str = ""  # why it is not verified (warn / off), else ""

    def to_json(self) -> dict[str, Any]:
        """The fields as plain JSON values (without model and version)."""
        body = asdict(self)
        del body["model"], body["version"]
        return body


class ProvenanceStore:
    """The provenance records of one device (`SYNC_WORK_DIR/provenance`).

    Args:
        root: The folder holding the records.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def record(self, item: Provenance) -> None:
        """Write (or replace) a version's record, durably.

        Args:
            item: The record.

        Raises:
            OSError: It cannot be written.
        """
        validate_model_name(item.model)
        validate_version(item.version)
        folder = ensure_dir(self.root / item.model)
        body = {"model": item.model, "version": item.version, **item.to_json()}
        atomic_write_bytes(folder / f"{item.version}.json", json.dumps(body).encode())

    def forget(self, model: str, version: int) -> None:
        """Remove a version's record (one that never installed); a missing record is fine."""
        validate_model_name(model)
        validate_version(version)
        try:
            (self.root / model / f"{version}.json").unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("cannot remove the provenance record of %s v%d: %s", model, version, exc)

    def get(self, model: str, version: int) -> Provenance | None:
        """A version's record, or None when there is none (or it cannot be read)."""
        path = self.root / model / f"{version}.json"
        try:
            if path.stat().st_size > _MAX_RECORD_BYTES:
                raise ValueError("too large")
            body = json.loads(path.read_bytes())
            return Provenance(
                model,
                version,
                signer=str(body.get("signer", "")),
                bundle_sha256=str(body.get("bundle_sha256", "")),
                verified=bool(body.get("verified", False)),
                policy=str(body.get("policy", "off")),
                reason=str(body.get("reason", "")),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError) as exc:
            logger.debug("provenance of %s version %d not readable: %s", model, version, exc)
            return None

    def signer(self, model: str, version: int) -> str:
        """A version's signer, or "" when unknown."""
        found = self.get(model, version)
        return found.signer if found is not None else ""
