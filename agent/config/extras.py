"""Optional features and the pip extra that brings each one's packages (pyproject.toml).

A config that turns on a feature whose extra is not installed fails when it is loaded, with one
line naming the extra (`edge-agent: error: ...`, exit status 3, as other config errors), instead
of an ImportError at the first request. Checking imports nothing: `find_spec` only looks.
"""

from __future__ import annotations

import importlib.util

__all__ = ["OPTIONAL", "installed", "missing_extra"]

# extra -> (the module that tells it is installed, the feature that needs it)
OPTIONAL: dict[str, tuple[str, str]] = {
    "s3": ("boto3", 'sync.source = "s3://..."'),
    "otel": ("opentelemetry.sdk", 'log.trace_mode = "opentelemetry"'),
    "grpcio": ("grpc", 'server.grpc_engine = "grpcio"'),
    "signing": ("model_signing", "sync.model_signature_policy, sign-model, verify-model"),
    "quantize": ("onnx", "edge-agent quantize"),
}


def installed(module: str) -> bool:
    """Whether `module` can be imported (without importing it; a parent package may be)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def missing_extra(extra: str, feature: str) -> str | None:
    """None when `extra`'s packages are installed; else the one-line reason, naming the fix."""
    module = OPTIONAL[extra][0]
    if installed(module):
        return None
    return (
        f"{feature} needs the {extra} extra ({module} is not installed): "
        f"pip install 'edge-agent[{extra}]'"
    )
