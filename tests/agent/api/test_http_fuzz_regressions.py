"""Requests the HTTP fuzzer (test_http_fuzz.py) found answered with a 5xx, kept as regressions.

Each sends the failing request as raw bytes (JSON text may carry numbers a float cannot hold and
lone surrogates no file name can hold) and expects the documented 4xx with the JSON error body.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.runtime.demo import mlp_model
from tests.agent.models.test_cache_swap import cli, start_agent, stop_agent
from tests.models import M_CONFIG, scale_model, write_model
from tests.server import explicit_agent


def _post_raw(url: str, path: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        error = exc
    assert error.headers["Content-Type"].startswith("application/json")
    return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("body", "key"),
    [
        # max_p95_ms * 1000 overflowed to infinity: OverflowError, a 500.
        (b'{"version": 2, "share": 0.5, "max_p95_ms": 1e308}', "max_p95_ms"),
        # A 400-digit integer does not fit a float: OverflowError in float(), a 500.
        (b'{"version": 2, "share": 1' + b"0" * 400 + b"}", "share"),
        (b'{"version": 2, "share": 0.5, "max_error_rate": 1' + b"0" * 400 + b"}", "max_error_rate"),
        # Python's json reads Infinity and 1e400 as float('inf').
        (b'{"version": 2, "share": 0.5, "max_p95_ms": Infinity}', "max_p95_ms"),
        (b'{"version": 2, "share": 1e400}', "share"),
    ],
)
def test_canary_policy_with_numbers_beyond_a_float_is_a_400(
    url: str, body: bytes, key: str
) -> None:
    status, doc = _post_raw(url, "/v2/models/mlp_classifier/canary", body)
    assert status == 400, doc
    assert set(doc) == {"error"}
    assert key in str(doc["error"])


def test_shared_memory_key_with_a_lone_surrogate_is_a_400(url: str) -> None:
    # os.open could not encode the key: UnicodeEncodeError, a 500.
    body = b'{"key": "/\\ud800", "offset": 0, "byte_size": 4}'
    status, doc = _post_raw(url, "/v2/systemsharedmemory/region/fuzz/register", body)
    assert status == 400, doc
    assert "invalid shared memory key" in str(doc["error"])


def test_bytes_input_with_a_lone_surrogate_is_a_400(url: str) -> None:
    # str.encode() of the BYTES element raised UnicodeEncodeError: a 500.
    body = b'{"inputs": [{"name": "A", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}'
    status, doc = _post_raw(url, "/v2/models/mixed_add/infer", body)
    assert status == 400, doc
    assert "input 'A': BYTES data must be valid Unicode" in str(doc["error"])


def test_a_body_whose_content_encoding_does_not_decode_is_a_400(url: str) -> None:
    # aiohttp's RequestPayloadError is no HTTPException: it was answered as an internal error.
    request = urllib.request.Request(
        f"http://{url}/v2/models/mixed_add/infer",
        data=b"{}",
        method="POST",
        headers={"Content-Encoding": "gzip"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    doc = json.loads(caught.value.read())
    assert doc == {
        "error": "could not read the request body: Can not decode content-encoding: gzip"
    }


@pytest.mark.parametrize("name", ["..%2Foutside", "%2E%2E", "%2E", ".hidden"])
def test_explicit_load_of_a_name_outside_the_repository_loads_nothing(
    tmp_path: Path, name: str
) -> None:
    # root / "../outside" was loaded as a model (a Python model there would run its code);
    # ".." was tried as a model folder. Now each is a model the repository does not have.
    repo = tmp_path / "models"
    write_model(repo, "m", scale_model(2.0))
    write_model(tmp_path, "outside", scale_model(3.0))
    write_model(repo, ".hidden", scale_model(4.0))
    with explicit_agent(repo) as agent:
        url = f"127.0.0.1:{agent.http_port}"
        status, doc = _post_raw(url, f"/v2/repository/models/{name}/load", b"")
        unknown = _post_raw(url, "/v2/repository/models/nope/load", b"")
        _, index = _post_raw(url, "/v2/repository/index", b"")
    assert status == unknown[0]  # Triton's answer to a model it does not have
    assert "failed to poll from model repository: no model " in str(doc["error"])
    assert [row["name"] for row in index] == ["m"]


def _get_raw(url: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{url}{path}", timeout=30) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        error = exc
    assert error.headers["Content-Type"].startswith("application/json")
    return error.code, json.loads(error.read())


# "²" is a digit to str.isdigit() but not to int(): ValueError, a 500.
SUPERSCRIPT_TWO = "%C2%B2"


@pytest.mark.parametrize("route", ["", "/ready", "/config", "/stats"])
def test_a_version_that_is_a_unicode_digit_matches_no_route(url: str, route: str) -> None:
    # As Triton's routes: a version is ASCII digits, anything else is no route (404).
    status, doc = _get_raw(url, f"/v2/models/mixed_add/versions/{SUPERSCRIPT_TWO}{route}")
    assert status == 404, doc
    assert doc == {"error": "Not Found"}


def test_activating_a_version_that_is_a_unicode_digit_is_a_400(url: str) -> None:
    path = f"/v2/repository/models/mixed_add/versions/{SUPERSCRIPT_TWO}/activate"
    status, doc = _post_raw(url, path, b"")
    assert status == 400, doc
    assert doc == {"error": "version must be a positive integer, got '\u00b2'"}


def test_a_version_folder_named_with_a_unicode_digit_is_not_a_version(tmp_path: Path) -> None:
    # list_versions took "²/" for a version folder, and int() failed the whole model.
    repo = tmp_path / "models"
    write_model(repo, "m", scale_model(2.0))
    (repo / "m" / "\u00b2").mkdir()
    with explicit_agent(repo) as agent:
        status, doc = _get_raw(f"127.0.0.1:{agent.http_port}", "/v2/models/m")
    assert status == 200, doc
    assert doc["versions"] == ["1"]


@pytest.fixture(scope="module")
def cache_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An agent serving model m version 1 from a model cache; its host:port."""
    tmp = tmp_path_factory.mktemp("cache")
    write_model(tmp / "src", "m", mlp_model(seed=1), M_CONFIG, (1,))
    cache = str(tmp / "cache")
    result = cli(
        "cache", "install", "m", "1", str(tmp / "src/m"), "--cache-dir", cache, "--activate"
    )
    assert result.returncode == 0, result.stderr
    proc, port = start_agent(tmp / "cache")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_agent(proc)


# The cache refused these names and numbers with its InvalidVersionError, which the agent
# answered as a 500 (a failed load, or an internal error).
@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v2/repository/models/%2E%2E/rollback", b"", "invalid model name '..'"),
        ("/v2/repository/models/%2E%2E/clear-rejected", b"", "invalid model name '..'"),
        ("/v2/repository/models/..%2Fx/versions/1/activate", b"", "invalid model name '../x'"),
        (
            "/v2/repository/models/m/versions/99999999999999999999999/activate",
            b"",
            "invalid version number 99999999999999999999999",
        ),
        (
            "/v2/repository/models/m/rollback",
            b'{"version": 99999999999999999999999}',
            "invalid version number 99999999999999999999999",
        ),
        (
            "/v2/repository/models/m/clear-rejected",
            b'{"version": 1000000000000000000}',
            "invalid version number 1000000000000000000",
        ),
    ],
)
def test_cache_requests_with_names_the_cache_cannot_hold_are_a_400(
    cache_agent: str, path: str, body: bytes, message: str
) -> None:
    status, doc = _post_raw(cache_agent, path, body)
    assert (status, doc) == (400, {"error": message})


def test_cached_versions_of_a_name_the_cache_cannot_hold_is_a_400(cache_agent: str) -> None:
    status, doc = _get_raw(cache_agent, "/v2/repository/models/%2E%2E/versions")
    assert (status, doc) == (400, {"error": "invalid model name '..'"})
    status, doc = _get_raw(cache_agent, "/v2/repository/models/m/versions")
    assert status == 200
    assert [(row["version"], row["state"]) for row in doc] == [(1, "active")]
