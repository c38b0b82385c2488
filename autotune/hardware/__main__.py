"""`python -m autotune.hardware report [--json] [--profile PRESET]`."""

import sys

from autotune.commands.report import main

sys.exit(main(sys.argv[1:]))
