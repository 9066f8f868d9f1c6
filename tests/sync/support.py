"""Real servers on loopback and small builders for the sync tests."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuf.api.metadata import Metadata, MetaFile, Snapshot, Targets, Timestamp

from model_cache import ModelCache
from sync.client import SyncClient
from sync.fetcher import Downloader
from sync.keys import load_signers, metadata_dir, read_root
from sync.policy import parse_desired
from sync.publish import Publisher
from sync.store import ObjectStore


def make_model(root: Path, name: str, version: int, payload: bytes, config: str = "") -> Path:
    """A Triton model folder `root/name` with config.pbtxt and `version/model.onnx`."""
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    text = config or f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    (folder / "config.pbtxt").write_text(text)
    (folder / str(version) / "model.onnx").write_bytes(payload)
    return folder


def payload(version: int, size: int = 64 * 1024) -> bytes:
    """Deterministic bytes that differ per version."""
    block = hashlib.sha256(f"v{version}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def active(cache: ModelCache, model: str) -> int | None:
    """The version the cache serves for `model`."""
    found = cache.active_version(model)
    return None if found is None else found.version


@dataclass
class World:
    """A publisher's repository, a store, a device cache and a trusted root."""

    repo: Path
    store: ObjectStore
    cache: ModelCache
    work: Path
    sources: Path
    publisher: Publisher = field(init=False)

    def __post_init__(self) -> None:
        self.publisher = Publisher(self.repo, self.store)

    @property
    def trusted_root(self) -> bytes:
        return (metadata_dir(self.repo) / "1.root.json").read_bytes()

    def publish(self, model: str, version: int, size: int = 64 * 1024) -> None:
        folder = make_model(self.sources / f"v{version}", model, version, payload(version, size))
        self.publisher.publish(model, version, folder)

    def client(self, desired: tuple[str, ...] = ("*=latest",), **kwargs: Any) -> SyncClient:
        kwargs.setdefault("downloader", Downloader(self.store, sleep=lambda _s: None))
        return SyncClient(
            self.store, self.cache, self.trusted_root, self.work, parse_desired(desired), **kwargs
        )

    def sync_and_activate(self, desired: tuple[str, ...] = ("*=latest",)) -> None:
        report = self.client(desired).sync_once()
        assert not report.errors, report.errors
        for model, version in report.activate:
            self.cache.activate(model, version)

    def upload_bytes(self, key: str, data: bytes) -> None:
        tmp = self.sources / "upload.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        self.store.put(key, tmp)

    def read_object(self, key: str) -> bytes:
        return b"".join(self.store.get(key))

    def local(self, role: str) -> Metadata[Any]:
        return Metadata.from_bytes((metadata_dir(self.repo) / f"{role}.json").read_bytes())

    def forge_chain(
        self,
        edit_targets: Callable[[Targets], None] | None = None,
        targets_signers: list[Any] | None = None,
        timestamp_signers: list[Any] | None = None,
    ) -> None:
        """Sign and upload targets → snapshot → timestamp outside the publisher's checks.

        The attacker (or a broken publisher) model: targets edited at will, and any of the
        roles signed by whichever keys are given (default: the real keys).
        """
        root = read_root(self.repo).signed
        signers = load_signers(self.repo)

        def real(role: str) -> list[Any]:
            return [signers[k] for k in root.roles[role].keyids if k in signers]

        targets = self.local("targets")
        if edit_targets is not None:
            edit_targets(targets.signed)
        targets.signed.version += 1
        _sign(targets, targets_signers if targets_signers is not None else real("targets"))
        t_bytes = targets.to_bytes()
        self.upload_bytes(f"metadata/{targets.signed.version}.targets.json", t_bytes)
        snapshot: Metadata[Snapshot] = self.local("snapshot")
        snapshot.signed.meta["targets.json"] = MetaFile(
            targets.signed.version, len(t_bytes), {"sha256": hashlib.sha256(t_bytes).hexdigest()}
        )
        snapshot.signed.version += 1
        _sign(snapshot, real("snapshot"))
        s_bytes = snapshot.to_bytes()
        self.upload_bytes(f"metadata/{snapshot.signed.version}.snapshot.json", s_bytes)
        timestamp: Metadata[Timestamp] = self.local("timestamp")
        timestamp.signed.snapshot_meta = MetaFile(
            snapshot.signed.version, len(s_bytes), {"sha256": hashlib.sha256(s_bytes).hexdigest()}
        )
        timestamp.signed.version += 1
        _sign(timestamp, timestamp_signers if timestamp_signers is not None else real("timestamp"))
        self.upload_bytes("metadata/timestamp.json", timestamp.to_bytes())


def _sign(md: Metadata[Any], signers: list[Any]) -> None:
    md.signatures.clear()
    for signer in signers:
        md.sign(signer, append=True)


@dataclass
class HttpFaults:
    """What the HTTP server does wrong, and what it saw."""

    cut_after: dict[str, int] = field(default_factory=dict)  # path suffix → bytes, once
    endless: set[str] = field(default_factory=set)  # path suffixes answered with endless data
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header)
    lock: threading.Lock = field(default_factory=threading.Lock)


def http_server(root: Path, faults: HttpFaults) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A static file server for `root` with Range support and the given faults."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: Any) -> None:
            return

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].lstrip("/")
            rng = self.headers.get("Range", "")
            with faults.lock:
                faults.ranges.append((path, rng))
                endless = any(path.endswith(s) for s in faults.endless)
                cut = next(
                    (faults.cut_after.pop(s) for s in list(faults.cut_after) if path.endswith(s)),
                    None,
                )
            if endless:
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                block = b"\0" * 65536
                try:
                    for _ in range(100_000):  # ~6.5 GB: "endless" for any honest cap
                        self.wfile.write(block)
                except OSError:
                    return
                return
            file = root / path
            if ".." in path.split("/") or not file.is_file():
                self.send_error(404)
                return
            data = file.read_bytes()
            start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
            if start >= len(data) and rng:
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = data[start:]
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            if cut is not None:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body if cut is None else body[:cut])
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def files_under(root: Path) -> Iterator[Path]:
    """Every regular file below `root`."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            yield Path(dirpath) / name
