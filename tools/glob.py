"""The `glob` tool: files matching a glob pattern under the workdir (or a path in it), newest first."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path, PurePosixPath

from stockade.tools.base import ToolContext, ToolError, tool
from stockade.tools.paths import canonical, permitted_roots, resolve_path, within
from stockade.tools.toolset_schemas import GLOB_SCHEMA

__all__ = ["GLOB_RESULT_LIMIT", "WALK_MAX_ENTRIES", "glob"]

GLOB_RESULT_LIMIT = 200
WALK_MAX_ENTRIES = 50_000
"""Caps the matches held in memory, so a pattern over a huge tree cannot exhaust the worker."""


@tool(name="glob", description="List files matching a glob pattern, newest first.", input_schema=GLOB_SCHEMA)
def glob(pattern: str, ctx: ToolContext, path: str | None = None) -> str:
    """List files matching a glob pattern, newest first."""
    if Path(pattern).is_absolute():
        raise ToolError("glob: absolute pattern not permitted; pass a relative pattern (and optionally path)")
    # `Path.glob` follows literal `..` segments, which would leave the root before any check.
    if ".." in PurePosixPath(pattern).parts:
        raise ToolError("glob: '..' is not permitted in the pattern")
    root = resolve_path(ctx, path, "glob") if path else permitted_roots(ctx)[0]
    try:
        matches = list(_confined(islice(root.glob(pattern), WALK_MAX_ENTRIES), root))
    except (ValueError, OSError) as exc:
        raise ToolError(f"glob: {exc}") from exc
    if not matches:
        return "no matches"
    matches.sort(key=_mtime_or_zero, reverse=True)
    return "\n".join(str(m) for m in matches[:GLOB_RESULT_LIMIT])


def _confined(matches: Iterable[Path], root: Path) -> Iterator[Path]:
    """The matches whose canonical path stays under `root` (glob follows symlinks in plain segments)."""
    for match in matches:
        try:
            if within(canonical(match), root):
                yield match
        except OSError:
            continue


def _mtime_or_zero(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
