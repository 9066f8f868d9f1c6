"""The bound on an ONNX Runtime session's intra-op threads, for the agent's setting
(`models.intra_op_threads`) and a model's `intra_op_thread_count` parameter alike.

ONNX Runtime creates every thread when the session is made: a mistyped 100000 hangs the load
for minutes and 2**20 ends the process (measured), so a larger count is refused with a reason.
"""

from __future__ import annotations

MAX_INTRA_OP_THREADS = 256
