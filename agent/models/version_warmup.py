"""Warming up one loaded model version on its config's `model_warmup` samples.

Each sample is validated against the completed config's signature first, so a sample the
config cannot hold fails the version with a clear `ModelConfigError`, never a runtime crash.
"""

from __future__ import annotations

from pathlib import Path

from agent.backends.base import Backend
from agent.errors import AgentError, ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.warmup import warmup_requests
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.tensors.signature import ModelSignature

__all__ = ["warm_up"]


def warm_up(config: mc.ModelConfig, model_dir: Path, backend: Backend) -> None:
    """Run each warm-up sample `count` times on `backend`.

    Raises:
        ModelConfigError: a sample does not match the config's inputs.
        AgentError: the runtime failed on a sample.
    """
    signature = ModelSignature.from_config(config)
    for sample_name, request, count in warmup_requests(config, model_dir):
        try:
            valid = signature.validate(request)
        except AgentError as exc:
            raise ModelConfigError(f"model_warmup '{sample_name}': {exc.message}") from None
        feeds = dict(valid.feeds)
        if config.HasField("sequence_batching"):
            feeds.update(
                SequenceTensors.from_config(config, model_dir).starting_feeds(valid.batch_size)
            )
        for _ in range(count):
            backend.run(feeds, valid.output_names)
