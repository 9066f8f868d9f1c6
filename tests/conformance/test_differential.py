"""The agent against the real tritonserver: every case of the corpus sent to both, compared.

One parametrized test over tests/conformance/cases.py; both servers are started once for the
module (tests/conformance/conftest.py). A case that fails names the difference.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from tests.conformance.cases import corpus
from tests.conformance.compare import Case, assert_same, send
from tests.conformance.conftest import Pair

pytestmark = [pytest.mark.e2e, pytest.mark.external]

# One key per process: two runs of the suite at once must not share (or unlink) a region.
SHM_KEY = f"/edge_agent_conformance_{os.getpid()}"
CASES = corpus(SHM_KEY)


@pytest.fixture(scope="module")
def region() -> Iterator[shared_memory.SharedMemory]:
    shm = shared_memory.SharedMemory(SHM_KEY.lstrip("/"), create=True, size=64)
    try:
        yield shm
    finally:
        shm.close()
        shm.unlink()


def _reset(shm: shared_memory.SharedMemory) -> None:
    """INPUT0, INPUT1 for the shared-memory cases; the output area zeroed."""
    data = struct.pack("<8f", 1, 2, 3, 4, 0.5, 0.5, 0.5, 0.5) + bytes(32)
    assert shm.buf is not None
    shm.buf[: len(data)] = data


def _param(case: Case) -> object:
    if case.known:
        return pytest.param(case, id=case.id, marks=pytest.mark.xfail(reason=case.known))
    return pytest.param(case, id=case.id)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_the_agent_answers_as_triton(
    case: Case, pair: Pair, region: shared_memory.SharedMemory
) -> None:
    _reset(region)
    triton = send(pair.triton, case.call, case.metrics)
    assert region.buf is not None
    triton_region = bytes(region.buf[32:48])
    _reset(region)
    agent = send(pair.agent, case.call, case.metrics)
    agent_region = bytes(region.buf[32:48])
    assert_same(case, triton, agent, str(pair.repo))
    assert agent_region == triton_region, "shared memory written differently"


def test_the_corpus_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
