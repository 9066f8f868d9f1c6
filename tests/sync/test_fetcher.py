"""Downloads: length caps, endless data, Range resume (HTTP and S3), StoreFetcher for python-tuf."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tuf.api import exceptions as tuf_exceptions

from model_cache import ModelCache
from sync.errors import DownloadError, TargetError
from sync.fetcher import Downloader, StoreFetcher
from sync.s3 import S3Store
from sync.store import FileStore, HttpStore, ObjectStore
from tests.sync.support import HttpFaults, World, active, payload


def _downloader(store: ObjectStore, **kwargs: object) -> Downloader:
    return Downloader(store, sleep=lambda _s: None, **kwargs)  # type: ignore[arg-type]


def test_endless_object_is_cut_off_at_the_signed_length(
    tmp_path: Path, http_url: str, http_faults: HttpFaults
) -> None:
    http_faults.endless.add("big.bin")
    seen: list[int] = []
    with pytest.raises(TargetError, match="longer than its signed length"):
        _downloader(HttpStore(http_url)).download("big.bin", tmp_path / "p", 10_000, seen.append)
    assert sum(seen) <= 10_000
    assert not (tmp_path / "p").exists()


def test_interrupted_http_download_resumes_with_range(
    tmp_path: Path, http_url: str, http_faults: HttpFaults
) -> None:
    data = payload(7, 3 * 1024 * 1024)
    (tmp_path / "bucket" / "obj").write_bytes(data)
    http_faults.cut_after["obj"] = 1_000_000
    part = tmp_path / "obj.part"
    _downloader(HttpStore(http_url)).download("obj", part, len(data), lambda _n: None)
    assert part.read_bytes() == data
    ranges = [r for p, r in http_faults.ranges if p == "obj"]
    assert len(ranges) == 2
    assert ranges[0] == ""
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 900_000 < resumed_at <= 1_000_000


def test_shorter_object_is_a_target_error(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(b"x" * 100)
    with pytest.raises(TargetError, match="ends at 100 bytes"):
        _downloader(FileStore(tmp_path)).download("obj", tmp_path / "p", 200, lambda _n: None)
    assert not (tmp_path / "p").exists()


def test_part_longer_than_signed_is_discarded(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(b"a" * 50)
    (tmp_path / "p").write_bytes(b"b" * 80)
    _downloader(FileStore(tmp_path)).download("obj", tmp_path / "p", 50, lambda _n: None)
    assert (tmp_path / "p").read_bytes() == b"a" * 50


class _Flaky:
    """Wraps a store: while `down`, model files break off at byte `cut`; records offsets."""

    def __init__(self, inner: ObjectStore, cut: int) -> None:
        self.inner = inner
        self.cut = cut
        self.down = True
        self.offsets: list[tuple[str, int]] = []

    @property
    def url(self) -> str:
        return self.inner.url

    def get(self, key: str, offset: int = 0) -> Iterator[bytes]:
        self.offsets.append((key, offset))
        if not self.down or not key.endswith("model.onnx"):
            return self.inner.get(key, offset)
        if offset >= self.cut:
            raise DownloadError("connection refused", path=key)
        return self._broken(self.inner.get(key, offset), key, self.cut - offset)

    def _broken(self, chunks: Iterator[bytes], key: str, room: int) -> Iterator[bytes]:
        for chunk in chunks:
            if len(chunk) >= room:
                yield chunk[:room]
                raise DownloadError("connection reset by peer", path=key)
            room -= len(chunk)
            yield chunk

    def put(self, key: str, source: Path) -> None:
        self.inner.put(key, source)


def test_interrupted_s3_download_resumes_in_a_later_cycle(world: World) -> None:
    world.publish("mlp", 1, size=3 * 1024 * 1024)
    flaky = _Flaky(world.store, 1_500_000)
    first = world.client(downloader=Downloader(flaky, max_resumes=0, sleep=lambda _s: None))
    report = first.sync_once()
    assert report.transient
    assert report.installed == ()
    assert active(world.cache, "mlp") is None
    flaky.down = False
    report = world.client(downloader=Downloader(flaky, sleep=lambda _s: None)).sync_once()
    assert report.installed == (("mlp", 1),)
    assert report.resumed_bytes == 1_500_000
    model_reads = [off for key, off in flaky.offsets if key.endswith("model.onnx")]
    assert model_reads == [0, 1_500_000, 1_500_000]


def test_tampered_part_file_is_dropped_and_fetched_again_whole(world: World) -> None:
    world.publish("mlp", 1, size=2 * 1024 * 1024)
    info = world.local("targets").signed.targets["mlp/1/1/model.onnx"]
    part = world.work / "downloads" / f"{info.hashes['sha256']}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\xff" * 1000)  # a prefix that is not the signed content (or a torn one)
    report = world.client().sync_once()
    assert report.errors == ()
    assert report.installed == (("mlp", 1),)  # in the same cycle: the whole file again
    assert not part.exists()


def test_store_fetcher_maps_missing_objects_to_404(s3_store: S3Store) -> None:
    fetcher = StoreFetcher(s3_store)
    with pytest.raises(tuf_exceptions.DownloadHTTPError) as caught:
        fetcher.fetch(s3_store.url + "metadata/2.root.json")
    assert caught.value.status_code == 404
    with pytest.raises(tuf_exceptions.DownloadError, match="outside the store"):
        fetcher.fetch("http://elsewhere.example/metadata/timestamp.json")


def test_metadata_over_its_length_cap_is_refused(s3_store: S3Store, tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"{" * 20_000)
    s3_store.put("metadata/timestamp.json", tmp_path / "big")
    with pytest.raises(tuf_exceptions.DownloadLengthMismatchError):
        StoreFetcher(s3_store).download_bytes(s3_store.url + "metadata/timestamp.json", 16384)


def test_parallel_downloads_of_several_versions(world: World, cache: ModelCache) -> None:
    for version in (1, 2, 3):
        world.publish("mlp", version)
    world.publish("other", 5)
    report = world.client(("mlp=1,2,3", "other=latest"), max_parallel=4).sync_once()
    assert sorted(report.installed) == [("mlp", 1), ("mlp", 2), ("mlp", 3), ("other", 5)]
    assert sorted(report.activate) == [("mlp", 3), ("other", 5)]
    assert [v.version for v in cache.list_versions("mlp")] == [1, 2, 3]
