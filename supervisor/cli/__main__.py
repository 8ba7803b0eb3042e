"""`python -m stockade.supervisor.cli`: the `stockade` command line."""

import sys

from stockade.supervisor.cli.app import main

sys.exit(main())
