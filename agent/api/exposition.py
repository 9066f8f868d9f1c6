"""Prometheus text format 0.0.4, with counters typed `counter` under their exact names.

prometheus-client's `generate_latest` renames every `counter` family to `<name>_total` (the
`# TYPE` line and the samples). Triton declares its counters `# TYPE nv_inference_count counter`
and its samples carry no `_total`; dashboards and alerts written for Triton query those names,
and Prometheus only treats a series as a counter (no "not a counter" warning from `rate()`)
when its family is typed so. `render_text` therefore writes each family under `Metric.name` and
each sample under the name it was built with: a counter family whose samples are named as the
family keeps its exact name. The rest is the format `generate_latest` writes: `unknown` as
`untyped`, the same escaping and number formatting.
"""

from __future__ import annotations

from typing import Final

from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# OpenMetrics types the classic text format has no word for, and the word it uses instead.
_TYPE_WORDS: Final = {
    "unknown": "untyped",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
}


def render_text(registry: Collector) -> bytes:
    """Every family `registry` collects, in the classic text format, names unchanged."""
    out: list[str] = []
    for family in registry.collect():
        kind = _TYPE_WORDS.get(family.type, family.type)
        out.append(f"# HELP {family.name} {_escape_help(family.documentation)}\n")
        out.append(f"# TYPE {family.name} {kind}\n")
        out.extend(_sample_line(sample) for sample in family.samples)
    return "".join(out).encode()


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _sample_line(sample: Sample) -> str:
    labels = ""
    if sample.labels:
        pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(sample.labels.items()))
        labels = "{" + pairs + "}"
    stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
    value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
    return f"{sample.name}{labels} {value}{stamp}\n"
