"""`python -m bench` runs the benchmark; `python -m bench --help` lists its options."""

import sys

from bench.cli import main

sys.exit(main())
