"""The text exposition: counters typed `counter` under their exact names, as Triton writes them."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from agent.api.exposition import render_text


class _Fixed:
    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _registry(*families: Metric) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(*families))
    return registry


def test_a_counter_keeps_its_name_and_type() -> None:
    counter = Metric("nv_inference_count", "Number of inferences", "counter")
    counter.add_sample("nv_inference_count", {"model": "m", "version": "1"}, 3)
    text = render_text(_registry(counter)).decode()
    assert text == (
        "# HELP nv_inference_count Number of inferences\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="m",version="1"} 3.0\n'
    )
    # prometheus-client would have renamed it; Prometheus' parser reads ours as a counter.
    assert "nv_inference_count_total" in generate_latest(_registry(counter)).decode()
    (family,) = text_string_to_metric_families(text)
    assert (family.name, family.type) == ("nv_inference_count", "counter")


def test_other_types_render_as_prometheus_client_does() -> None:
    gauge = GaugeMetricFamily("g", 'multi\nline \\ "help"', labels=("l",))
    gauge.add_metric(['a"b\\c\nd'], 1e10)
    untyped = UnknownMetricFamily("u", "old style", value=float("inf"))
    summary = Metric("s", "a summary", "summary")
    summary.add_sample("s_count", {}, 2)
    summary.add_sample("s", {"quantile": "0.5"}, 0.25)
    registry = _registry(gauge, untyped, summary)
    assert render_text(registry) == generate_latest(registry)
