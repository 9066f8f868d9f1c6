"""Prometheus text as it is written, read with prometheus-client's parser.

The parser keeps a counter's samples the OpenMetrics way, as `<name>_total`, even where the text
names them `<name>` (Triton's counters, and the agent's), and names such a family without its
`_total` even where the text writes it. `read_families` gives families and samples back the
name the text wrote, so a test asserts on the exposition a scraper sees.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


def read_families(text: str) -> list[Metric]:
    """Every family of `text`, named as the text names it, each sample too."""
    found = []
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            added = family.name + "_total"
            if f"# TYPE {family.name} counter\n" not in text:
                family.name = added  # written with its `_total`: the parser took it off
            family.samples = [
                s._replace(name=family.name) if s.name == added else s for s in family.samples
            ]
        found.append(family)
    return found
