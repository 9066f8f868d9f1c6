"""Which changed config keys a SIGHUP cannot apply live (pure: two configs in, keys out)."""

from __future__ import annotations

import dataclasses

from agent.canary.policy import CanaryPolicy
from agent.config.schema import AgentConfig
from agent.runtime.reload import restart_keys


def test_changed_keys_name_their_section_and_key() -> None:
    running = AgentConfig()
    moved = dataclasses.replace(running, server=dataclasses.replace(running.server, http_port=9000))
    assert restart_keys(running, moved) == ["server.http_port"]
    assert restart_keys(running, running) == []


def test_a_changed_canary_table_needs_a_restart() -> None:
    running = AgentConfig()
    with_canary = dataclasses.replace(
        running, canary=(("m", CanaryPolicy(candidate=2, share=0.1)),)
    )
    assert restart_keys(running, with_canary) == ["canary"]
