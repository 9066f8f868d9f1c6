"""The `edge-agent` command line: one front door per sub-command.

`doctor` runs before anything imports ONNX Runtime, so it can say what is missing, and `fleet`
(the fleet manager, `agent.manager`) never loads the device's serving stack; every other command
needs an importable ONNX Runtime and stops with the fix when there is none. `serve` has a door of
its own too (`agent.cli.serve`): a serving agent imports no other command's modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_NO_RUNTIME = 2

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run `edge-agent ARGS` (default: the process's arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["doctor"]:
        from agent.cli import doctor  # noqa: PLC0415 - the serving stack stays unloaded

        return doctor.main(args[1:])
    if args[:1] == ["fleet"]:
        from agent.manager.cli import main as fleet_main  # noqa: PLC0415 - the manager alone

        return fleet_main(args[1:])
    from agent.device.checks import ORT_FIX  # noqa: PLC0415 - cheap, and only here
    from agent.device.facts import onnxruntime_import_error  # noqa: PLC0415

    missing = onnxruntime_import_error()
    if missing is not None:
        print(
            f"edge-agent: error: no ONNX Runtime is importable ({missing}); {ORT_FIX}. "
            "`edge-agent doctor` reports what this device has.",
            file=sys.stderr,
        )
        return EXIT_NO_RUNTIME
    if args[:1] == ["serve"]:
        from agent.cli import serve  # noqa: PLC0415 - serving's imports only (its own door)

        return serve.main(args)
    from agent.cli.commands import main as run_command  # noqa: PLC0415 - needs onnxruntime

    return run_command(argv)
