"""Which of the supervisor's import folders a worker puts on its `sys.path`."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from stockade.sandbox.paths import within_any
from stockade.sandbox.policy import ResourcePolicy

__all__ = ["safe_import_paths"]


def safe_import_paths(paths: Sequence[str], policy: ResourcePolicy, workdir: str) -> list[str]:
    """The folders of `paths` that no tool of `policy` can write to, and that are not yet on sys.path
    (a folder a tool may write to would let it plant a module for a later call to import)."""
    writable = [os.path.realpath(p) for p in (workdir, *policy.writable_paths)]
    present = {os.path.realpath(p) for p in sys.path if p}
    return [
        path
        for path in (os.path.realpath(p) for p in paths)
        if path not in present and not within_any(path, writable)
    ]
