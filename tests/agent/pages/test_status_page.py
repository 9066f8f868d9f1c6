"""The device status page (`GET /`, `GET /v2/status`) in a real browser and over plain HTTP."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.pages import UNAUTHORIZED
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import ensure_demo_repository
from tests.agent.pages.browser import (
    browser_fixture,
    first_paint_ms,
    rows_of,
    screenshots,
    text_of,
    wait_for,
)
from tests.server import http_client, running_agent
from tests.support import http_get

browser = browser_fixture()


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of `edge-agent serve --demo`'s repository that the test may add a version to."""
    generated = ensure_demo_repository(tmp_path_factory.mktemp("demo") / "generated")
    repo = tmp_path_factory.mktemp("demo") / "repo"
    shutil.copytree(generated, repo)
    return repo


@pytest.fixture(scope="module")
def demo_agent(demo_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, status_sample_ms=200),
        models=ModelsConfig(
            repository=demo_repo,
            intra_op_threads=1,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    with running_agent(config) as agent:
        yield agent


def _infer(client: httpclient.InferenceServerClient, count: int) -> None:
    data = np.ones((1, 64), dtype=np.float32)
    for _ in range(count):
        tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("mlp_classifier", [tensor])


def _model_rows(driver: Any) -> list[str]:
    return rows_of(driver, "#models-body tr")


def _serving_rows(driver: Any) -> list[str]:
    return rows_of(driver, "#serving-body tr")


def test_the_page_shows_the_demo_models_and_a_hot_swap_without_a_reload(
    browser: Any, demo_agent: RunningAgent, demo_repo: Path
) -> None:
    base = f"http://127.0.0.1:{demo_agent.http_port}/"
    with http_client(demo_agent) as client:
        _infer(client, 20)
    browser.get(base)
    cold = first_paint_ms(browser)
    browser.get(base)  # the browser's own start-up is out of the second figure
    print(f"device status page: first contentful paint {cold:.1f} ms (cold browser), "
          f"{first_paint_ms(browser):.1f} ms (warm)")  # fmt: skip
    rows = _model_rows(browser)
    assert any(r.startswith("mlp_classifier 1 READY") for r in rows), rows
    assert any(r.startswith("mlp_classifier 2 READY") for r in rows), rows
    assert any(r.startswith("mixed_add 1 READY") for r in rows), rows
    assert "Open on loopback only" in text_of(browser, "#access")
    # The figures of the requests made above arrive with a later sample: the poll shows them.
    wait_for(browser, lambda d: any(r.endswith(" 20 0") for r in _serving_rows(d)))
    browser.execute_script("window.notReloaded = true;")

    # Hot swap: a version 3 appears in the repository and is loaded (load before unload).
    shutil.copytree(demo_repo / "mlp_classifier" / "2", demo_repo / "mlp_classifier" / "3")
    with http_client(demo_agent) as client:
        client.load_model("mlp_classifier")
    wait_for(browser, lambda d: any(r.startswith("mlp_classifier 3 READY") for r in _model_rows(d)))
    assert browser.execute_script("return window.notReloaded === true;")
    wait_for(browser, lambda d: any(" version_activated mlp_classifier 3 " in r
                                    for r in rows_of(d, "#events-body tr")))  # fmt: skip
    with http_client(demo_agent) as client:
        _infer(client, 20)
    wait_for(browser, lambda d: any(r.startswith("mlp_classifier 3 ") and r.endswith(" 20 0")
                                    for r in _serving_rows(d)))  # fmt: skip
    screenshots(browser, "status")


def test_the_status_json_is_compact_and_carries_the_sampled_history(
    demo_agent: RunningAgent,
) -> None:
    status, body = http_get(f"http://127.0.0.1:{demo_agent.http_port}/v2/status")
    assert status == 200
    doc = json.loads(body)
    assert doc["access"] == "loopback"
    assert {m["name"] for m in doc["models"]} >= {"mlp_classifier", "mixed_add"}
    assert doc["memory"]["budget_bytes"] > 0
    assert "mlp_classifier:1" in doc["history"]
    assert body.startswith(b'{"agent_version":')  # compact: no pretty-printing on the wire


@pytest.fixture(scope="module")
def token_agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, status_token="s3cret"),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent


@pytest.mark.parametrize("path", ["/", "/v2/status"])
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}],
    ids=["missing", "wrong", "not-bearer"],
)
def test_without_the_token_the_answer_is_401_and_reveals_nothing(
    token_agent: RunningAgent, path: str, headers: dict[str, str]
) -> None:
    status, body = http_get(f"http://127.0.0.1:{token_agent.http_port}{path}", headers)
    assert (status, body) == (401, UNAUTHORIZED)
    status, body = http_get(f"http://127.0.0.1:{token_agent.http_port}{path}?token=wrong")
    assert (status, body) == (401, UNAUTHORIZED)


def test_with_the_token_the_page_opens_says_so_and_keeps_polling(
    browser: Any, token_agent: RunningAgent
) -> None:
    base = f"http://127.0.0.1:{token_agent.http_port}"
    status, _ = http_get(base + "/v2/status", {"Authorization": "Bearer s3cret"})
    assert status == 200
    browser.get(base + "/?token=s3cret")
    assert "Token required" in text_of(browser, "#access")
    # The script sends the token as a Bearer header: its polls succeed.
    wait_for(browser, lambda d: text_of(d, "#updated").startswith("Updated"))


def test_beyond_loopback_without_a_token_the_page_is_closed(model_repo: Path) -> None:
    config = AgentConfig(
        server=ServerConfig(host="0.0.0.0", http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        status, body = http_get(f"http://127.0.0.1:{agent.http_port}/")
        assert (status, body) == (401, UNAUTHORIZED)
        status, _ = http_get(f"http://127.0.0.1:{agent.http_port}/v2/health/ready")
        assert status == 200  # the API itself is governed by its own settings
