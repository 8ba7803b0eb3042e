"""The `edit` tool: replace an exact string in a UTF-8 file inside the workdir (unique unless replace_all)."""

from __future__ import annotations

from pathlib import Path
from stat import S_ISREG

from stockade.tools.base import ToolContext, ToolError, tool
from stockade.tools.paths import fs_error, resolve_path
from stockade.tools.toolset_schemas import EDIT_SCHEMA

__all__ = ["MAX_EDIT_BYTES", "edit"]

MAX_EDIT_BYTES = 256 * 1024
"""Edit loads the whole file; a larger one is refused rather than risking the worker's memory."""


@tool(name="edit", description="Replace text in a file by exact string match.", input_schema=EDIT_SCHEMA)
def edit(
    file_path: str, old_string: str, new_string: str, ctx: ToolContext, replace_all: bool | None = None
) -> str:
    """Replace text in a file by exact string match."""
    target = resolve_path(ctx, file_path, "edit")
    text = _load(target, file_path)
    count = text.count(old_string)
    if count == 0:
        raise ToolError(f"edit: old_string not found in {file_path}")
    if not replace_all and count > 1:
        raise ToolError(f"edit: old_string appears {count} times in {file_path} (must be unique)")
    updated = text.replace(old_string, new_string, -1 if replace_all else 1)
    try:
        target.write_bytes(updated.encode("utf-8"))
    except OSError as exc:
        raise fs_error("edit", file_path, exc) from exc
    return f"edited {file_path} ({count if replace_all else 1} replacement(s))"


def _load(target: Path, file_path: str) -> str:
    try:
        st = target.stat()
        if not S_ISREG(st.st_mode):
            raise ToolError(f"edit: {file_path}: not a regular file")
        if st.st_size > MAX_EDIT_BYTES:
            raise ToolError(
                f"edit: {file_path} is {st.st_size} bytes, exceeds {MAX_EDIT_BYTES}-byte limit. "
                "The edit tool loads the whole file and cannot modify a file this large."
            )
        return target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"edit: {file_path}: not valid UTF-8 text (cannot edit binary files)") from exc
    except OSError as exc:
        raise fs_error("edit", file_path, exc) from exc
