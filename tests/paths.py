"""Where the repository is, for the tests that run its files (the example policy, the wheel build)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
