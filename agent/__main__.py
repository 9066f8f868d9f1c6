"""`python -m agent` runs the command line."""

import sys

from agent.cli import main

sys.exit(main())
