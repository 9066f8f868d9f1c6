"""Model control in poll mode, the agent against the real tritonserver.

Both servers watch one repository (Triton: `--model-control-mode=poll --repository-poll-secs=1`;
the agent: `control_mode = poll`). Each test changes the repository as an operator would (a
model folder moved in, a version folder added or removed, a config broken), waits, with a
deadline, until both servers' repository index shows the change, and compares the index and
the answers of both (compare.py's rules). The tests run in order: each starts from the state
the one before left.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.config.choices import ModelControlMode
from tests.conformance.compare import JSON, Case, Grpc, Http, Side, assert_same, send
from tests.conformance.conftest import Pair, started_pair
from tests.conformance.repository import PASS_MODEL, VERSIONED_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.external]

DEADLINE_S = 30.0
QUIET_S = 4.5  # no model load or unload in Triton's log for this long: it is idle (poll every 1 s)

IO = """
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

VERSIONED = """
name: "versioned"
backend: "python"
max_batch_size: 0
version_policy: { latest: { num_versions: 1 } }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "V" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _model(folder: Path, config: str, code: str, versions: tuple[int, ...] = (1,)) -> None:
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / str(version)).mkdir()
        (folder / str(version) / "model.py").write_text(code)


def _write(repo: Path) -> Path:
    _model(repo / "base", 'backend: "python"\n' + IO, PASS_MODEL)
    _model(repo / "versioned", VERSIONED, VERSIONED_MODEL)
    return repo


@pytest.fixture(scope="module")
def polled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("poll")
    with started_pair(work, _write, ModelControlMode.POLL) as started:
        yield started


def _rows(side: Side) -> list[dict[str, str]]:
    reply = send(side, Http("POST", "/v2/repository/index", body={}))
    assert reply.status == 200, reply
    rows: JSON = reply.body
    # an empty reason: Triton leaves the field out, the agent sends "" (KNOWN, "http-index-")
    rows = [{k: v for k, v in r.items() if k != "reason" or v} for r in rows]
    return sorted(rows, key=lambda r: (r["name"], r.get("version", "")))


def _index(side: Side) -> list[tuple[str, str, str]]:
    return [(r["name"], r.get("version", ""), r.get("state", "")) for r in _rows(side)]


def _await(pair: Pair, settled: Callable[[list[tuple[str, str, str]]], bool]) -> None:
    """Poll both servers' index until `settled` holds for each, or fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    waiting = [pair.triton, pair.agent]
    while waiting:
        waiting = [side for side in waiting if not _settled(_index(side), settled)]
        if waiting and time.monotonic() > deadline:
            rows = {side.name: _index(side) for side in waiting}
            raise AssertionError(f"not settled within {DEADLINE_S} s: {rows}")
        time.sleep(0.2)  # polling the servers, not a timing assertion


def _settled(
    rows: list[tuple[str, str, str]], settled: Callable[[list[tuple[str, str, str]]], bool]
) -> bool:
    """`settled` holds and no version is still on its way (Triton shows LOADING, UNLOADING)."""
    return settled(rows) and not any(state.endswith("LOADING") for _, _, state in rows)


def _triton_idle(pair: Pair) -> None:
    """Wait (deadline) until Triton has logged no model load or unload for two poll intervals:
    Triton reloads a model once more at the poll after it loaded it (its folder's times moved),
    and a change made meanwhile races that reload (Triton 2.51 then hangs loading a vanished
    file). Four intervals of quiet, not two: on cores shared with the rest of the suite, Triton's
    poll comes late (two let that race through once in a full `make test`)."""
    log = pair.repo.parent / "tritonserver.log"

    def events() -> int:
        return log.read_text(errors="replace").count("model_lifecycle.cc")

    deadline = time.monotonic() + DEADLINE_S
    seen, since = events(), time.monotonic()
    while time.monotonic() - since < QUIET_S:
        assert time.monotonic() < deadline, "Triton kept loading models"
        time.sleep(0.2)  # watching the log, not a timing assertion
        if events() != seen:
            seen, since = events(), time.monotonic()


def _same_index(pair: Pair) -> None:
    assert _rows(pair.agent) == _rows(pair.triton)


def _infer(model: str) -> Http:
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [7]}]}
    return Http("POST", f"/v2/models/{model}/infer", body=body)


def _same_answer(pair: Pair, case: Case) -> None:
    assert_same(case, send(pair.triton, case.call), send(pair.agent, case.call), str(pair.repo))


def _move_in(pair: Pair, name: str, config: str, code: str, versions: tuple[int, ...]) -> None:
    """Write a model folder beside the repository, then rename it in (complete at once)."""
    staging = pair.repo.parent / "staging" / name
    _model(staging, config, code, versions)
    staging.rename(pair.repo / name)


def test_models_of_the_repository_are_served_at_start(polled: Pair) -> None:
    _same_index(polled)
    _same_answer(polled, Case("poll-infer-base", "poll", _infer("base")))


def test_a_model_moved_in_is_loaded(polled: Pair) -> None:
    _triton_idle(polled)
    _move_in(polled, "added", 'backend: "python"\n' + IO, PASS_MODEL, (1,))
    _await(polled, lambda rows: ("added", "1", "READY") in rows)
    _same_index(polled)
    _same_answer(polled, Case("poll-infer-added", "poll", _infer("added")))


def test_a_new_version_folder_is_served_under_the_policy(polled: Pair) -> None:
    _triton_idle(polled)
    staging = polled.repo.parent / "staging" / "v2"
    staging.mkdir(parents=True)
    (staging / "model.py").write_text(VERSIONED_MODEL)
    staging.rename(polled.repo / "versioned" / "2")
    _await(polled, lambda rows: ("versioned", "2", "READY") in rows)
    _await(polled, lambda rows: ("versioned", "1", "READY") not in rows)  # latest 1 only
    _same_answer(polled, Case("poll-infer-v2", "poll", _infer("versioned")))
    _same_answer(polled, Case("poll-infer-v1-gone", "poll", _infer("versioned/versions/1")))
    _same_index(polled)


def test_a_removed_version_folder_is_unloaded(polled: Pair) -> None:
    _triton_idle(polled)
    shutil.rmtree(polled.repo / "versioned" / "2")
    _await(polled, lambda rows: ("versioned", "1", "READY") in rows)
    _await(polled, lambda rows: ("versioned", "2", "READY") not in rows)
    _same_answer(polled, Case("poll-infer-v1-back", "poll", _infer("versioned")))
    _same_answer(polled, Case("poll-infer-v2-gone", "poll", _infer("versioned/versions/2")))
    _same_index(polled)


def test_a_broken_config_edit_keeps_what_is_served(polled: Pair) -> None:
    _triton_idle(polled)
    (polled.repo / "base" / "config.pbtxt").write_text('backend: "python"\ninput [ { oops')
    # a model moved in after the edit: once both serve it, both have seen the edit too
    _move_in(polled, "marker", 'backend: "python"\n' + IO, PASS_MODEL, (1,))
    _await(polled, lambda rows: ("marker", "1", "READY") in rows)
    _same_answer(polled, Case("poll-infer-after-broken-edit", "poll", _infer("base")))
    _same_index(polled)


def test_a_removed_model_folder_is_unloaded(polled: Pair) -> None:
    _triton_idle(polled)
    shutil.rmtree(polled.repo / "added")
    # Triton's index lists the folders it finds at once; the model goes at the next poll
    deadline = time.monotonic() + DEADLINE_S
    for side in (polled.triton, polled.agent):
        while send(side, Http("GET", "/v2/models/added/ready")).status == 200 or any(
            name == "added" for name, _, _ in _index(side)
        ):
            assert time.monotonic() < deadline, f"{side.name} still serves 'added'"
            time.sleep(0.2)  # polling the server, not a timing assertion
    _same_answer(polled, Case("poll-infer-removed", "poll", _infer("added")))
    _same_index(polled)


@pytest.mark.parametrize(
    "case",
    [
        Case("poll-http-load", "poll", Http("POST", "/v2/repository/models/base/load", body={})),
        Case("poll-http-unload", "poll", Http("POST", "/v2/repository/models/base/unload")),
        Case("poll-grpc-load", "poll", Grpc("RepositoryModelLoad", {"model_name": "base"})),
        Case("poll-grpc-unload", "poll", Grpc("RepositoryModelUnload", {"model_name": "base"})),
    ],
    ids=lambda case: case.id,
)
def test_load_and_unload_are_refused_in_poll_mode(polled: Pair, case: Case) -> None:
    _same_answer(polled, case)
