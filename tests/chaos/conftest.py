"""The chaos suite's helpers (`chaos_harness`, `chaos_tools`) live in this directory: put it on
`sys.path` for the tests, and on PYTHONPATH (passed through the policy) for the sandbox's workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [HERE, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
