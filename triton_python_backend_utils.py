"""`import triton_python_backend_utils as pb_utils`, as Triton's Python models write it.

This name is `agent.pb_utils` itself (one module object, not a copy): models written for
Triton's Python backend run unchanged, and `from agent import pb_utils` keeps working.
"""

import sys

from agent import pb_utils

sys.modules[__name__] = pb_utils
