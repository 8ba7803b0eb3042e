"""Where a worker may import tool modules from.

Workers start with `-P -s` (no script directory, no current directory, no user site on `sys.path`), so
a tool cannot plant a module in its workdir for a later call to import. The folders a user's own tool
modules live in come from the supervisor instead: by default the folders on its own `sys.path` (the
current directory), minus the interpreter's own, which the worker has. The
worker drops any of them that a tool may write to: its workdir and the policy's writable paths.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

from stockade.sandbox.policy import ResourcePolicy

__all__ = ["default_import_paths", "safe_import_paths"]


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def default_import_paths() -> list[str]:
    """The folders on this process's `sys.path` that are not the interpreter's own, and the current
    directory (as `python -m` has it; a console script's `sys.path` starts with its own bin folder)."""
    interpreter = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found: list[str] = []
    for entry in [*sys.path, os.getcwd()]:
        folder = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(folder) and not _inside(folder, interpreter) and folder not in found:
            found.append(folder)
    return found


def safe_import_paths(paths: Sequence[str], policy: ResourcePolicy, workdir: str) -> list[str]:
    """The folders of `paths` that no tool of `policy` can write to, and that are not yet on sys.path."""
    writable = [os.path.realpath(p) for p in (workdir, *policy.writable_paths)]
    present = {os.path.realpath(p) for p in sys.path if p}
    return [
        path
        for path in (os.path.realpath(p) for p in paths)
        if path not in present and not _inside(path, writable)
    ]
