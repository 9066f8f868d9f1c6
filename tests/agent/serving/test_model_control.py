"""triton_rows: the repository index's rows in the shape Triton answers them."""

from __future__ import annotations

from agent.serving.model_control import triton_rows


def test_rows_take_tritons_shape() -> None:
    rows = [
        {"name": "ok", "version": "1", "state": "READY", "reason": ""},
        {"name": "slow", "version": "2", "state": "READY", "reason": "CPU fallback: ..."},
        {"name": "bad", "version": "1", "state": "UNAVAILABLE", "reason": "Internal: boom"},
        {"name": "config", "state": "UNAVAILABLE", "reason": "max_batch_size -1 is not in ..."},
        {"name": "idle"},
    ]
    assert triton_rows(rows) == [
        {"name": "ok", "version": "1", "state": "READY"},  # no reason: none at all
        {"name": "slow", "version": "2", "state": "READY", "reason": "CPU fallback: ..."},
        {"name": "bad", "version": "1", "state": "UNAVAILABLE", "reason": "Internal: boom"},
        {"name": "config"},  # its config failed: the name alone (the reason is in its metadata)
        {"name": "idle"},
    ]
