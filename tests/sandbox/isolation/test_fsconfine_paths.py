"""Filesystem confinement keeps stockade's own source folders importable when stockade is installed in
editable mode from a checkout under a covered directory (e.g. a clone in /tmp)."""

from __future__ import annotations

from pathlib import Path

import stockade.tools
from stockade.sandbox.isolation.fsconfine import interpreter_paths


def test_the_folders_of_stockades_packages_are_kept() -> None:
    kept = interpreter_paths()
    for folder in stockade.tools.__path__:
        assert str(Path(folder).resolve()) in kept or folder in kept
