"""The fleet link: MQTT adapter, command parsing and execution, outbox, telemetry, SLO."""
