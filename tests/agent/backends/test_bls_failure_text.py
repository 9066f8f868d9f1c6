"""How a BLS request that cannot reach its model fails: Triton's words first, ours after."""

from __future__ import annotations

from agent.backends.python.bls import failure_text
from agent.errors import ModelNotFoundError


def test_a_model_that_is_not_there_fails_in_triton_s_words() -> None:
    text = failure_text("nowhere", ModelNotFoundError("'nowhere' is not found"))

    assert text.startswith(
        "Model nowhere - Error when running inference: Failed for execute the inference "
        "request. Model 'nowhere' is not ready."
    )
    assert text.endswith("'nowhere' is not found")
