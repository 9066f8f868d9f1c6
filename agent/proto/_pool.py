"""The descriptor pool of the agent's generated protobuf code.

Triton's Python client registers its own `model_config.proto` (package `inference`) in
protobuf's default pool; ours has the same names, so both cannot live in the default pool of
one process (tests and tools import both). `make proto` rewrites the generated modules to
register in this private pool instead.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
