"""`python -m bench.dataplane_cost`: each layer's CPU per call, in-process, on the demo MLP."""

from __future__ import annotations

import re

import pytest

from bench.dataplane_cost import LAYERS, main


@pytest.mark.parametrize("stub", [True, False])
def test_the_table_has_every_layer(stub: bool, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--calls", "50", "--rounds", "2", *(["--stub"] if stub else [])]) == 0
    out = capsys.readouterr().out
    minima = {}
    for layer in LAYERS:
        row = re.search(rf"^\| {re.escape(layer)} +\| +([\d.]+) +\|", out, re.MULTILINE)
        assert row is not None, out
        minima[layer] = float(row.group(1))
    assert all(figure > 0 for figure in minima.values())
    if stub:  # each layer holds the one below; with a stub runtime by a wide margin (~20x)
        assert minima["backend.run"] < minima["scheduler.submit"] < minima["dataplane.infer"]
    assert "load average before/after" in out
