"""The reboot is the agent itself: `edge-agent serve` on what a cut left, asked for an answer."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tests.powercut import agent_boot
from tests.powercut.cutrun import record
from tests.powercut.image import materialize


@pytest.mark.usefixtures("fuse_ready")
def test_the_agent_started_after_a_cut_answers_with_a_complete_reported_version(
    tmp_path: Path,
) -> None:
    journal = record("", tmp_path, module="tests.powercut.agent_boot")
    points = journal.cut_points()

    def inside(before: str, after: str) -> list[int]:
        return [i for i, p in enumerate(points) if before in p.marks and after not in p.marks]

    activating_2 = inside("installed:m:2", "active:m:2")
    rolling_back = [i for i, p in enumerate(points) if sum("active:" in m for m in p.marks) == 2]
    chosen = [
        points[activating_2[len(activating_2) // 2]],
        points[activating_2[-1]],
        points[rolling_back[-1]],
        points[-1],
    ]
    images = [(p, "drop", image) for p, image in journal.replay(chosen)]
    torn = journal.replay(chosen[:2], random.Random(5))
    images += [(p, "torn", image) for p, image in torn]
    served = []
    for n, (point, mode, image) in enumerate(images):
        version, out = agent_boot.boot_and_infer(materialize(image, tmp_path / f"image{n}"))
        assert version in agent_boot.allowed_versions(point.marks), (point.k, mode, version)
        assert version is not None
        assert out is not None
        np.testing.assert_allclose(out, agent_boot.expected_output(version), rtol=1e-5)
        served.append(version)
    assert served[3] == 2  # the run ended serving version 2, and that was reported
