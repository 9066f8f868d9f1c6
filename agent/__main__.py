"""`python -m agent` runs the command line."""

import sys

from agent.cli.main import main

sys.exit(main())
