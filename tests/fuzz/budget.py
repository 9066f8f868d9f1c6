"""How hard the property tests try: a bounded number of examples each, raised for long runs.

    EDGE_AGENT_FUZZ_EXAMPLES=20000 pytest tests/fuzz     # a long run (minutes to hours)

By default each property runs `DEFAULT_EXAMPLES` examples, so the whole folder takes seconds on
two cores. Examples are not stored between runs (no `.hypothesis/` folder in the checkout): a
failure prints the example, and each one found so far is kept as an `@example` or a plain test.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 60


def examples() -> int:
    """The examples per property: `EDGE_AGENT_FUZZ_EXAMPLES`, else the default."""
    raw = os.environ.get("EDGE_AGENT_FUZZ_EXAMPLES", "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else DEFAULT_EXAMPLES


FUZZ = settings(
    max_examples=examples(),
    deadline=None,  # shared CI cores: time is not what these tests judge
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def scaled(fraction: float) -> settings:
    """FUZZ with a fraction of the examples, for properties whose every example loads a model."""
    return settings(FUZZ, max_examples=max(5, int(examples() * fraction)))
