"""Batching, queue policies, statistics, metrics and the response cache, end to end over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from tests.models import write_model
from tests.prometheus_text import read_families
from tests.server import running_agent

MLP_IO = """
platform: "onnxruntime_onnx"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""

CONFIGS = {
    # A batch forms only when 8 rows are queued: the delay is far beyond the test's length.
    "preferred": "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 8 ] "
    "max_queue_delay_microseconds: 60000000 }",
    # Fewer rows than preferred: the delay bound releases them as one batch.
    "delayed": "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 8 ] "
    "max_queue_delay_microseconds: 300000 }",
    "bounded": "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 8 ] "
    "max_queue_delay_microseconds: 300000 default_queue_policy { max_queue_size: 2 } }",
    "timeout": "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 8 ] "
    "max_queue_delay_microseconds: 60000000 default_queue_policy { "
    "default_timeout_microseconds: 100000 timeout_action: REJECT } }",
    "prio": "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 0 "
    "priority_levels: 2 default_priority_level: 2 }",
    "ordered": "max_batch_size: 4 instance_group [ { count: 2 kind: KIND_CPU } ] "
    "dynamic_batching { preserve_ordering: true }",
    "cached": "max_batch_size: 8 response_cache { enable: true }",
    "plain": "max_batch_size: 8",
}


@pytest.fixture(scope="module")
def sched_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("sched") / "models"
    model = mlp_model()
    for name, extra in CONFIGS.items():
        write_model(repo, name, model, f'name: "{name}"\n{MLP_IO}\n{extra}\n')
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=0),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent


def body(rows: int = 1, seed: int = 0, **params: Any) -> dict[str, Any]:
    x = np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 64], "data": x.ravel().tolist()}
        ]
    }
    if params:
        doc["parameters"] = params
    return doc


async def post_many(port: int, model: str, docs: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    async with aiohttp.ClientSession() as session:

        async def one(doc: dict[str, Any]) -> tuple[int, Any]:
            async with session.post(url, json=doc) as resp:
                return resp.status, await resp.json()

        return await asyncio.gather(*(one(d) for d in docs))


def stats(port: int, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    first: dict[str, Any] = doc["model_stats"][0]
    return first


def batch_sizes(model_stats: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in model_stats["batch_stats"]}


def test_preferred_batch_forms_without_waiting_for_the_delay(sched_agent: RunningAgent) -> None:
    results = asyncio.run(
        post_many(sched_agent.http_port, "preferred", [body(seed=i) for i in range(8)])
    )
    assert [status for status, _ in results] == [200] * 8
    s = stats(sched_agent.http_port, "preferred")
    assert batch_sizes(s) == {8: 1}
    assert s["execution_count"] == 1
    assert s["inference_count"] == 8


def test_multi_row_requests_batch_by_rows(sched_agent: RunningAgent) -> None:
    docs = [body(rows=3, seed=1), body(rows=3, seed=2), body(rows=2, seed=3)]
    results = asyncio.run(post_many(sched_agent.http_port, "preferred", docs))
    assert [len(r["outputs"][0]["data"]) for _, r in results] == [30, 30, 20]
    assert batch_sizes(stats(sched_agent.http_port, "preferred"))[8] == 2


def test_delay_bound_releases_a_partial_batch(sched_agent: RunningAgent) -> None:
    results = asyncio.run(
        post_many(sched_agent.http_port, "delayed", [body(seed=i) for i in range(3)])
    )
    assert [status for status, _ in results] == [200] * 3
    assert batch_sizes(stats(sched_agent.http_port, "delayed")) == {3: 1}


def test_batched_outputs_equal_single_runs(sched_agent: RunningAgent) -> None:
    docs = [body(seed=100 + i) for i in range(8)]
    batched = asyncio.run(post_many(sched_agent.http_port, "preferred", docs))
    single = asyncio.run(post_many(sched_agent.http_port, "plain", docs[:1]))
    np.testing.assert_allclose(
        batched[0][1]["outputs"][0]["data"], single[0][1]["outputs"][0]["data"], rtol=1e-5
    )


def test_full_queue_is_503_at_once(sched_agent: RunningAgent) -> None:
    results = asyncio.run(
        post_many(sched_agent.http_port, "bounded", [body(seed=i) for i in range(3)])
    )
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 200, 503]
    error = next(r["error"] for status, r in results if status == 503)
    assert "queued" in error
    s = stats(sched_agent.http_port, "bounded")
    assert s["inference_stats"]["fail"]["count"] == 1
    assert s["inference_stats"]["success"]["count"] == 2


def test_queue_timeout_rejects(sched_agent: RunningAgent) -> None:
    [(status, doc)] = asyncio.run(post_many(sched_agent.http_port, "timeout", [body()]))
    assert status == 503
    assert "timeout" in doc["error"]


def test_priority_parameter_is_checked(sched_agent: RunningAgent) -> None:
    good = asyncio.run(
        post_many(sched_agent.http_port, "prio", [body(priority=1), body(priority=2)])
    )
    assert [s for s, _ in good] == [200, 200]
    [(status, doc)] = asyncio.run(post_many(sched_agent.http_port, "prio", [body(priority=7)]))
    assert status == 400
    assert "priority" in doc["error"]
    [(status, doc)] = asyncio.run(post_many(sched_agent.http_port, "prio", [body(priority="high")]))
    assert status == 400


def test_preserve_ordering_answers_every_request(sched_agent: RunningAgent) -> None:
    docs = [body(rows=1 + i % 4, seed=i) for i in range(12)]
    results = asyncio.run(post_many(sched_agent.http_port, "ordered", docs))
    assert [len(r["outputs"][0]["data"]) for _, r in results] == [
        10 * (1 + i % 4) for i in range(12)
    ]


def test_statistics_and_metrics_count_exactly(sched_agent: RunningAgent) -> None:
    port = sched_agent.http_port
    before = stats(port, "plain")["inference_stats"]
    asyncio.run(post_many(port, "plain", [body(seed=i) for i in range(5)]))
    bad = body()
    bad["inputs"][0]["shape"] = [1, 63]  # decodes, then fails the model's shape check
    bad["inputs"][0]["data"] = bad["inputs"][0]["data"][:63]
    asyncio.run(post_many(port, "plain", [bad, bad]))
    s = stats(port, "plain")
    inference = s["inference_stats"]
    success = inference["success"]["count"]
    assert success - before["success"]["count"] == 5
    # Refused by the model's checks, never run: no failure (as Triton).
    assert inference["fail"]["count"] == before["fail"]["count"]
    assert s["inference_count"] == sum(b * n for b, n in batch_sizes(s).items())
    assert inference["compute_infer"]["ns"] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{sched_agent.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in read_families(text)
        for sample in family.samples
    }
    labels = (("model", "plain"), ("version", "1"))
    assert samples[("nv_inference_request_success", labels)] == success
    assert (
        samples[("nv_inference_request_failure", (*labels[:1], ("reason", "OTHER"), labels[1]))]
        == inference["fail"]["count"]
    )
    assert samples[("nv_inference_exec_count", labels)] == s["execution_count"]
    assert (
        "nv_inference_request_summary_us",
        (*labels[:1], ("quantile", "0.99"), labels[1]),
    ) in samples


def test_response_cache_skips_the_model(sched_agent: RunningAgent) -> None:
    port = sched_agent.http_port
    first = asyncio.run(post_many(port, "cached", [body(seed=42)]))
    second = asyncio.run(post_many(port, "cached", [body(seed=42)]))
    assert first[0][1]["outputs"] == second[0][1]["outputs"]
    s = stats(port, "cached")
    assert s["inference_stats"]["cache_hit"]["count"] == 1
    assert s["inference_stats"]["cache_miss"]["count"] == 1
    assert s["execution_count"] == 1
    assert s["inference_stats"]["success"]["count"] == 2
    other = asyncio.run(post_many(port, "cached", [body(seed=43)]))
    assert other[0][1]["outputs"] != first[0][1]["outputs"]
    assert stats(port, "cached")["execution_count"] == 2


def test_stats_of_unknown_model_is_400_as_in_triton(sched_agent: RunningAgent) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{sched_agent.http_port}/v2/models/nope/stats")
    assert err.value.code == 400
    assert json.loads(err.value.read()) == {"error": "requested model 'nope' is not available"}


def test_all_stats_lists_every_model(sched_agent: RunningAgent) -> None:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{sched_agent.http_port}/v2/models/stats"
    ) as resp:
        names = {m["name"] for m in json.loads(resp.read())["model_stats"]}
    assert set(CONFIGS) <= names


def test_model_too_big_for_the_memory_budget_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "mlp", mlp_model(), f'name: "mlp"\n{MLP_IO}\nmax_batch_size: 8\n')
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, exit_on_error=False, memory_budget_bytes=1),
    )
    with running_agent(config) as agent:
        [row] = agent.dataplane.repository_index()
        assert row["state"] == "UNAVAILABLE"
        assert "MiB" in row["reason"]
        assert "budget" in row["reason"]
