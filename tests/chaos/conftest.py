"""The chaos suite's tool module (`chaos_tools`) lives in this directory: put it on PYTHONPATH (passed
through the policy) for the sandbox's workers. The tests import their helpers relatively."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [HERE, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture(autouse=True)
def _pids_visible_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos tools log their pids (and their grandchildren's) for the checks to watch from here:
    no PID namespace, whose pids this process cannot see (tests/sandbox/isolation/test_escapes_ns.py
    covers it)."""
    layers = [*filter(None, os.environ.get("STOCKADE_DISABLE_LAYERS", "").split(",")), "pidns"]
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", ",".join(layers))
