"""The fleet manager an operator runs on another machine: inventory, rollouts and their gate,
the Prometheus exporter and the dashboard. It shares only `agent.wire` with the device."""
