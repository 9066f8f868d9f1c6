"""The fleet manager is another machine's program: it runs without the device's serving stack."""

from __future__ import annotations

import json
import subprocess
import sys

# What only a device runs: the serving stack, the device's fleet link, its config, ONNX Runtime.
DEVICE_ONLY = (
    "agent.api",
    "agent.backends",
    "agent.canary",
    "agent.config",
    "agent.ensemble",
    "agent.fleet",
    "agent.models",
    "agent.pb_utils",
    "agent.repository",
    "agent.runtime",
    "agent.scheduling",
    "agent.serving",
    "agent.tensors",
    "agent.tracing",
    "grpc",
    "onnxruntime",
)


def test_every_manager_command_loads_none_of_the_device_stack() -> None:
    code = (
        "import json, sys\n"
        "import agent.manager.cli, agent.manager.cli_manage, agent.manager.exporter\n"
        "import agent.manager.dashboard, agent.manager.rollout_driver\n"
        "from agent.cli import main\n"
        "try:\n"
        "    main(['fleet', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "agent.manager.cli" in loaded
    device = sorted(
        m for m in loaded if m.split(".")[0] in DEVICE_ONLY or m.startswith(DEVICE_ONLY)
    )
    assert device == []
