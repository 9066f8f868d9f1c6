from __future__ import annotations

from model_cache import ModelCache
from tests.sync.support import World, active, payload


def test_sync_installs_and_activates_latest(world: World) -> None:
    world.publish("mlp", 1)
    report = world.client().sync_once()
    assert report.installed == (("mlp", 1),)
    assert report.activate == (("mlp", 1),)
    world.cache.activate("mlp", 1)
    world.publish("mlp", 2)
    report = world.client().sync_once()
    assert report.installed == (("mlp", 2),)
    assert report.activate == (("mlp", 2),)
    world.cache.activate("mlp", 2)
    served = world.cache.active_version("mlp")
    assert served is not None
    assert (served.path / "2" / "model.onnx").read_bytes() == payload(2)


def test_second_cycle_is_a_no_op(world: World, cache: ModelCache) -> None:
    world.publish("mlp", 1)
    world.sync_and_activate()
    report = world.client().sync_once()
    assert report.installed == ()
    assert report.activate == ()
    assert report.downloaded_bytes == 0
    assert active(cache, "mlp") == 1
