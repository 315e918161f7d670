"""`python -m smcsd ...`: the same command line as the `smcsd` console script (see smcsd/cli.py)."""

import sys

from smcsd.cli import main

sys.exit(main())
