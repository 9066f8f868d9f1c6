"""Sync of a ~100 MB model version from a loopback S3-protocol server (moto).

    python -m bench.sync_bench [--mb 100] [--runs 3]

Compares, on the same object from the same server:
  * plain copy: one boto3 GET streamed to a file (fsync at the end), nothing verified;
  * sync: `SyncClient.sync_once` end to end: TUF refresh, download with the length cap,
    python-tuf hash verification, `ModelCache.install` (hash + durable copy), activation.
Each measurement runs in a fresh child process, so the peak RSS is the syncing process's own
(ru_maxrss), not the S3 server's, which holds the object in memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _child_copy(endpoint: str, bucket: str, key: str, dest: Path) -> dict[str, float]:
    from sync.s3 import S3Store  # noqa: PLC0415
    from sync.store import S3Settings  # noqa: PLC0415

    store = S3Store(bucket, "", S3Settings(endpoint, "us-east-1"))
    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    size = 0
    with dest.open("wb") as out:
        for chunk in store.get(key):
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bytes": size, "rss_before": before, "peak_rss": _peak()}


def _child_sync(endpoint: str, bucket: str, root: Path, cache_dir: Path) -> dict[str, float]:
    from model_cache import ModelCache  # noqa: PLC0415
    from sync.client import SyncClient  # noqa: PLC0415
    from sync.policy import parse_desired  # noqa: PLC0415
    from sync.s3 import S3Store  # noqa: PLC0415
    from sync.store import S3Settings  # noqa: PLC0415

    store = S3Store(bucket, "", S3Settings(endpoint, "us-east-1"))
    with ModelCache(cache_dir, verify_on_open=False) as cache:
        client = SyncClient(
            store, cache, root.read_bytes(), cache_dir / "sync", parse_desired(["*=latest"])
        )
        before = psutil.Process().memory_info().rss
        start = time.perf_counter()
        report = client.sync_once()
        for model, version in report.activate:
            cache.activate(model, version)
        seconds = time.perf_counter() - start
    if report.errors or not report.installed:
        raise SystemExit(f"sync failed: {report.errors}")
    return {
        "seconds": seconds,
        "bytes": report.downloaded_bytes,
        "rss_before": before,
        "peak_rss": _peak(),
    }


def _peak() -> float:
    """VmHWM: this process image's peak RSS (ru_maxrss would include the forking parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) * 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _child(argv: list[str]) -> int:
    kind, endpoint, bucket, a, b = argv
    if kind == "copy":
        result = _child_copy(endpoint, bucket, a, Path(b))
    else:
        result = _child_sync(endpoint, bucket, Path(a), Path(b))
    print(json.dumps(result))
    return 0


def _run_child(*args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sync_bench", "--child", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **_ENV},
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sync_bench", description=__doc__)
    parser.add_argument("--mb", type=int, default=100, help="model file size (MiB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child)
    os.environ.update(_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    from sync.keys import init_keys  # noqa: PLC0415
    from sync.publish import Publisher, target_key  # noqa: PLC0415
    from sync.s3 import S3Store  # noqa: PLC0415
    from sync.store import S3Settings  # noqa: PLC0415

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="sync-bench-") as tmp_name:
            tmp = Path(tmp_name)
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            store = S3Store(bucket, "", S3Settings(endpoint, "us-east-1"))
            store.ensure_bucket()
            init_keys(tmp / "repo", {})
            model = tmp / "src" / "big"
            (model / "1").mkdir(parents=True)
            (model / "config.pbtxt").write_text('name: "big"\nplatform: "onnxruntime_onnx"\n')
            with (model / "1" / "model.onnx").open("wb") as out:
                for _ in range(args.mb):
                    out.write(os.urandom(1024 * 1024))
            Publisher(tmp / "repo", store).publish("big", 1, model)
            targets = json.loads((tmp / "repo" / "metadata" / "targets.json").read_text())
            info = targets["signed"]["targets"]["big/1/1/model.onnx"]
            from tuf.api.metadata import TargetFile  # noqa: PLC0415

            key = target_key(TargetFile.from_dict(dict(info), "big/1/1/model.onnx"))
            root = tmp / "repo" / "metadata" / "root.json"
            rows = []
            for run in range(args.runs):
                copy = _run_child("copy", endpoint, bucket, key, str(tmp / f"copy{run}"))
                (tmp / f"copy{run}").unlink()
                synced = _run_child("sync", endpoint, bucket, str(root), str(tmp / f"cache{run}"))
                rows.append((copy, synced))
    finally:
        server.stop()
    _report(rows)
    return 0


def _report(rows: list[tuple[dict[str, float], dict[str, float]]]) -> None:
    mib = 2**20
    print("run  copy MiB/s  sync MiB/s  sync/copy  sync peak RSS  (RSS before)  copy peak RSS")
    for i, (copy, synced) in enumerate(rows):
        c = copy["bytes"] / mib / copy["seconds"]
        s = synced["bytes"] / mib / synced["seconds"]
        print(
            f"{i:>3}  {c:>10.1f}  {s:>10.1f}  {s / c:>9.2f}  {synced['peak_rss'] / mib:>10.0f} MiB"
            f"  ({synced['rss_before'] / mib:>4.0f} MiB)  {copy['peak_rss'] / mib:>10.0f} MiB"
        )


if __name__ == "__main__":
    sys.exit(main())
