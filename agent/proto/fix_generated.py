"""Post-process protoc's Python output (run by `make proto`): private pool, package imports."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def fix(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    text = text.replace(
        "_descriptor_pool.Default().AddSerializedFile(",
        "_agent_pool.POOL.AddSerializedFile(",
    )
    if "from agent.proto import _pool as _agent_pool" not in text:
        text = text.replace(
            "from google.protobuf import descriptor_pool as _descriptor_pool\n",
            "from google.protobuf import descriptor_pool as _descriptor_pool\n"
            "from agent.proto import _pool as _agent_pool\n",
            1,
        )
    # protoc emits top-level imports of sibling modules; make them package imports.
    text = re.sub(
        r"^import (\w+_pb2) as (\w+)$", r"from agent.proto import \1 as \2", text, flags=re.M
    )
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        fix(Path(name))
