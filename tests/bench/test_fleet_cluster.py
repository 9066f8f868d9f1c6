"""bench.fleet_cluster with a hundred and fifty simulated devices: a 3-node RabbitMQ cluster,
devices spread over the nodes, the manager's node stopped in the middle of a rollout; the
rollout goes on, every device comes back, nobody runs a command twice, none is lost from the
inventory and the exporters still serve each device once."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet_brokers import rabbitmq_missing
from bench.fleet_cluster import ClusterOptions, run_cluster

pytestmark = pytest.mark.external  # RabbitMQ


def test_the_cluster_survives_the_managers_node_stopping_mid_rollout(tmp_path: Path) -> None:
    missing = rabbitmq_missing()
    if missing is not None:
        print(f"\nskipped: {missing}")
        pytest.skip(missing)
    report = run_cluster(ClusterOptions(devices=150, telemetry_s=1.0, soak_s=3.0), tmp_path)
    print("\n" + "\n\n".join(report.tables))
    assert not report.checks.failed, report.checks.table()
    figures = report.figures
    assert figures["devices_back_s"] is not None  # every device reconnected to the others
    assert len(figures["devices_per_node"]) == 3  # spread over every node before the stop
    assert sum(figures["devices_per_node_after"].values()) == 150
