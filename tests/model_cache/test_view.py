"""View generations and the atomic `repository` symlink, on hand-made version folders."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from model_cache import CacheError, CacheLayout
from model_cache.view import RepositoryView, ServedVersion

D1 = hashlib.sha256(b"one").hexdigest()
D2 = hashlib.sha256(b"two").hexdigest()


@pytest.fixture
def layout(tmp_path: Path) -> CacheLayout:
    layout = CacheLayout(tmp_path / "cache")
    for model, version, digest in [("m", 1, D1), ("m", 2, D2), ("n", 1, D1)]:
        unit = layout.version_dir(model, version, digest)
        (unit / str(version)).mkdir(parents=True)
        (unit / "config.pbtxt").write_text(f"{model} {version}")
        (unit / str(version) / "model.onnx").write_text(f"{model} v{version}")
    return layout


@pytest.fixture
def view(layout: CacheLayout) -> RepositoryView:
    return RepositoryView(layout)


def serve(view: RepositoryView, *entries: ServedVersion) -> str:
    name = view.build(entries)
    view.swap(name)
    return name


def test_a_built_view_is_served_after_the_swap(view: RepositoryView, layout: CacheLayout) -> None:
    name = view.build([ServedVersion("m", 1, D1)])
    assert view.current_name() is None
    assert view.read() is None

    view.swap(name)

    assert view.current_name() == name
    assert os.readlink(layout.repository) == f"views/{name}"
    assert (layout.repository / "m" / "1" / "model.onnx").read_text() == "m v1"
    assert (layout.repository / "m" / "config.pbtxt").read_text() == "m 1"
    assert view.read() == {"m": (1, D1[:12])}


def test_matches_compares_the_whole_view(view: RepositoryView) -> None:
    serve(view, ServedVersion("m", 1, D1), ServedVersion("n", 1, D1))

    assert view.matches([ServedVersion("n", 1, D1), ServedVersion("m", 1, D1)])
    assert not view.matches([ServedVersion("m", 1, D1)])
    assert not view.matches([ServedVersion("m", 2, D2), ServedVersion("n", 1, D1)])


def test_generations_only_grow(view: RepositoryView) -> None:
    first = serve(view, ServedVersion("m", 1, D1))
    second = serve(view, ServedVersion("m", 2, D2))

    assert second > first
    assert view.read() == {"m": (2, D2[:12])}


def test_a_reader_inside_the_previous_view_keeps_working(
    view: RepositoryView, layout: CacheLayout
) -> None:
    serve(view, ServedVersion("m", 1, D1))
    old_model_dir = layout.repository.resolve() / "m"

    serve(view, ServedVersion("m", 2, D2))
    view.prune(keep=2)

    assert (old_model_dir / "1" / "model.onnx").read_text() == "m v1"
    assert (layout.repository / "m" / "2" / "model.onnx").read_text() == "m v2"


def test_prune_keeps_current_and_newest_others(view: RepositoryView, layout: CacheLayout) -> None:
    names = [serve(view, ServedVersion("m", 1 + n % 2, D1 if n % 2 == 0 else D2)) for n in range(4)]

    assert view.prune(keep=2) == 2
    assert sorted(p.name for p in layout.views_dir.iterdir()) == names[2:]
    assert view.prune(keep=1) == 1
    assert [p.name for p in layout.views_dir.iterdir()] == [names[3]]


def test_discard_refuses_the_served_generation(view: RepositoryView) -> None:
    name = serve(view, ServedVersion("m", 1, D1))
    spare = view.build([ServedVersion("m", 2, D2)])

    view.discard(spare)

    with pytest.raises(CacheError):
        view.discard(name)
    assert view.read() == {"m": (1, D1[:12])}


def test_swap_refuses_to_replace_a_real_directory(
    view: RepositoryView, layout: CacheLayout
) -> None:
    layout.repository.mkdir()

    with pytest.raises(CacheError, match="not a symlink"):
        view.swap(view.build([]))


def test_read_rejects_an_unexpected_entry(view: RepositoryView, layout: CacheLayout) -> None:
    name = serve(view, ServedVersion("m", 1, D1))
    (layout.view_dir(name) / "m" / "2").symlink_to("../../../versions/m/1-" + D1[:12] + "/1")

    assert view.read() is None
    assert not view.matches([ServedVersion("m", 1, D1)])


def test_read_rejects_a_link_to_a_missing_version(
    view: RepositoryView, layout: CacheLayout
) -> None:
    serve(view, ServedVersion("m", 1, D1))
    os.rename(layout.version_dir("m", 1, D1), layout.root / "moved")

    assert view.read() is None


def test_read_rejects_a_retargeted_link(view: RepositoryView, layout: CacheLayout) -> None:
    name = serve(view, ServedVersion("m", 1, D1))
    link = layout.view_dir(name) / "m" / "1"
    link.unlink()
    link.symlink_to(layout.version_dir("n", 1, D1) / "1")  # absolute, and another model's

    assert view.read() is None


def test_a_dangling_repository_reads_as_nothing(view: RepositoryView, layout: CacheLayout) -> None:
    layout.repository.symlink_to("views/v00000042")

    assert view.current_name() is None
    assert view.read() is None
