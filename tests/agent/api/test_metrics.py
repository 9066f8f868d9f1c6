"""Prometheus exposition with Triton's metric names, read from the statistics at scrape time."""

from __future__ import annotations

import asyncio
import re

import prometheus_client
from aiohttp.test_utils import TestClient, TestServer

from agent.api.metrics import (
    CONTENT_TYPE,
    PsutilHostProbe,
    build_registry,
    create_metrics_app,
    render,
)
from agent.scheduling.statistics import StatisticsRegistry
from tests.fakes import FakeHostProbe, FakeMemoryBudget
from tests.prometheus_text import read_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(
    stats: StatisticsRegistry, memory: FakeMemoryBudget | None = None
) -> tuple[str, Samples]:
    body, _ = render(build_registry(stats, memory, host=FakeHostProbe()))
    text = body.decode()
    samples: Samples = {}
    for family in read_families(text):
        for s in family.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return text, samples


def key(
    name: str, model: str = "mlp", version: str = "1", **extra: str
) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({"model": model, "version": version, **extra}.items())


def populated() -> StatisticsRegistry:
    stats = StatisticsRegistry()
    m = stats.get("mlp", "1")
    for request_us, queue_us in [(100, 10), (300, 30), (200, 20)]:
        m.record_success(
            request_ns=request_us * 1_000,
            queue_ns=queue_us * 1_000,
            compute_input_ns=5_000,
            compute_infer_ns=50_000,
            compute_output_ns=2_000,
            now_ms=1,
        )
    m.record_execution(
        batch_size=3, compute_input_ns=5_000, compute_infer_ns=50_000, compute_output_ns=2_000
    )
    m.record_failure(request_ns=7_000, reason="REJECTED", now_ms=2)
    m.record_failure(request_ns=7_000, reason="BACKEND", now_ms=2)
    m.record_failure(request_ns=7_000, reason="BACKEND", now_ms=2)
    m.record_cache_hit(ns=4_000, now_ms=3, request_ns=6_000, queue_ns=1_000)
    m.record_cache_miss(ns=1_999)
    m.set_pending(5)
    other = stats.get("other", "2")
    other.record_execution(
        batch_size=8, compute_input_ns=0, compute_infer_ns=1_000, compute_output_ns=0
    )
    return stats


def test_counters_exact_per_model_and_version() -> None:
    _, s = scrape(populated())
    assert s[key("nv_inference_request_success")] == 4  # 3 computed + 1 cache hit
    assert s[key("nv_inference_count")] == 3
    assert s[key("nv_inference_exec_count")] == 1
    assert s[key("nv_inference_pending_request_count")] == 5
    # 600 µs computed + 6 µs cache hit + 1.999 µs cache miss, truncated to whole µs.
    assert s[key("nv_inference_request_duration_us")] == 607
    assert s[key("nv_inference_queue_duration_us")] == 61
    assert s[key("nv_inference_compute_input_duration_us")] == 15
    assert s[key("nv_inference_compute_infer_duration_us")] == 150
    assert s[key("nv_inference_compute_output_duration_us")] == 6
    assert s[key("nv_inference_count", "other", "2")] == 8
    assert s[key("nv_inference_exec_count", "other", "2")] == 1
    assert s[key("nv_inference_request_success", "other", "2")] == 0


def test_failure_counts_carry_reason_label() -> None:
    _, s = scrape(populated())
    name = "nv_inference_request_failure"
    assert s[key(name, reason="REJECTED")] == 1
    assert s[key(name, reason="BACKEND")] == 2
    assert s[key(name, reason="CANCELED")] == 0
    assert s[key(name, reason="OTHER")] == 0


def test_cache_metrics() -> None:
    _, s = scrape(populated())
    assert s[key("nv_cache_num_hits_per_model")] == 1
    assert s[key("nv_cache_num_misses_per_model")] == 1
    assert s[key("nv_cache_hit_duration_per_model")] == 4
    assert s[key("nv_cache_miss_duration_per_model")] == 1


def test_summaries_have_ordered_quantiles_count_and_sum() -> None:
    stats = StatisticsRegistry()
    m = stats.get("mlp", "1")
    for us in range(1, 201):
        m.record_success(
            request_ns=us * 1_000,
            queue_ns=0,
            compute_input_ns=0,
            compute_infer_ns=0,
            compute_output_ns=0,
            now_ms=0,
        )
    _, s = scrape(stats)
    name = "nv_inference_request_summary_us"
    values = [s[key(name, quantile=q)] for q in ("0.5", "0.9", "0.95", "0.99")]
    assert values == [100, 180, 190, 198]
    assert values == sorted(values)
    assert s[key(name + "_count")] == 200
    assert s[key(name + "_sum")] == sum(range(1, 201))
    for series in ("queue", "compute_input", "compute_infer", "compute_output"):
        summary = f"nv_inference_{series}_summary_us"
        assert s[key(summary + "_count")] == 200
        assert s[key(summary, quantile="0.99")] == 0


def test_exact_triton_names_without_total_suffix() -> None:
    text, _ = scrape(populated())
    assert not re.findall(r"nv_(?:inference|cache)\w*_total", text)
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_request_failure counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert "# TYPE nv_inference_queue_summary_us summary" in text
    assert 'nv_inference_request_success{model="mlp",version="1"} 4.0' in text


def test_memory_source_and_host_gauges() -> None:
    _, s = scrape(populated(), FakeMemoryBudget())
    assert s["edge_agent_memory_budget_bytes", frozenset()] == 4_000_000
    assert s["edge_agent_memory_used_bytes", frozenset()] == 1_500_000
    assert s["edge_agent_memory_models_bytes", frozenset()] == 200_000
    assert s["edge_agent_memory_inflight_capacity_bytes", frozenset()] == 1_000_000
    assert s["edge_agent_memory_inflight_bytes", frozenset()] == 300_000
    assert s["edge_agent_memory_inflight_peak_bytes", frozenset()] == 300_000
    assert s["edge_agent_memory_inflight_refused_total", frozenset()] == 1
    assert s["nv_cpu_utilization", frozenset()] == 0.25
    assert s["nv_cpu_memory_total_bytes", frozenset()] == 8_000
    assert s["nv_cpu_memory_used_bytes", frozenset()] == 3_000


def test_no_memory_source_leaves_agent_gauges_out() -> None:
    text, _ = scrape(populated(), None)
    assert "edge_agent_memory" not in text


def test_psutil_host_probe_reports_plausible_values() -> None:
    probe = PsutilHostProbe()
    total, used = probe.memory_bytes()
    assert total > 0
    assert 0 <= used <= total
    assert 0.0 <= probe.cpu_utilization() <= 1.0


def test_scrape_reads_statistics_live_and_drops_removed_models() -> None:
    stats = StatisticsRegistry()
    registry = build_registry(stats, None, host=FakeHostProbe())
    m = stats.get("mlp", "1")
    m.pending_inc()
    first = render(registry)[0].decode()
    assert 'nv_inference_pending_request_count{model="mlp",version="1"} 1.0' in first
    m.pending_dec()
    second = render(registry)[0].decode()
    assert 'nv_inference_pending_request_count{model="mlp",version="1"} 0.0' in second
    stats.remove("mlp", "1")
    assert 'model="mlp"' not in render(registry)[0].decode()


def test_two_registries_do_not_interfere() -> None:
    a, b = StatisticsRegistry(), StatisticsRegistry()
    a.get("only_a", "1").set_pending(3)
    b.get("only_b", "1").set_pending(4)
    text_a, _ = scrape(a)
    text_b, _ = scrape(b)
    assert "only_a" in text_a
    assert "only_b" not in text_a
    assert "only_b" in text_b
    assert "only_a" not in text_b
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "nv_inference" not in default


def test_render_content_type() -> None:
    body, content_type = render(build_registry(StatisticsRegistry(), None, host=FakeHostProbe()))
    assert content_type == CONTENT_TYPE
    assert content_type.startswith("text/plain; version=0.0.4")
    assert b"nv_cpu_utilization 0.25" in body


def test_metrics_app_serves_prometheus_text() -> None:
    async def fetch() -> tuple[int, str, str]:
        registry = build_registry(populated(), FakeMemoryBudget(), host=FakeHostProbe())
        async with TestClient(TestServer(create_metrics_app(registry))) as client:
            resp = await client.get("/metrics")
            return resp.status, resp.headers["Content-Type"], await resp.text()

    status, content_type, text = asyncio.run(fetch())
    assert status == 200
    assert content_type.startswith("text/plain")
    assert 'nv_inference_exec_count{model="other",version="2"} 1.0' in text
    assert "edge_agent_memory_budget_bytes 4e+06" in text
