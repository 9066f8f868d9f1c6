"""A whole agent with its fleet link in one process, for the kill -9 test.

    python -m tests.link_process REPOSITORY BROKER_PORT STATE_FILE

Prints READY once the link is started; runs until SIGTERM (clean stop) or until killed.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.fleet.config import MqttConfig
from agent.fleet.link import FleetLink
from agent.runtime.daemon import start_agent


async def main(repository: Path, port: int, state: Path) -> None:
    config = AgentConfig(
        server=ServerConfig(http_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repository, intra_op_threads=1),
    )
    agent = await start_agent(config)
    mqtt = MqttConfig(
        host="127.0.0.1",
        port=port,
        device_id="killme",
        reconnect_min_ms=100,
        reconnect_max_ms=500,
        keepalive_s=5,
    )
    link = FleetLink(mqtt, agent.dataplane, agent.registry, agent.registry.ledger, state)
    await link.start()
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await link.stop()
    await agent.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])))
