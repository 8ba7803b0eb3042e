"""`python -m stockade.supervisor`: the `stockade` command line."""

import sys

from stockade.supervisor.cli import main

sys.exit(main())
