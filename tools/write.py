"""The `write` tool: write (overwrite) a UTF-8 file inside the workdir, creating parent directories."""

from __future__ import annotations

from stockade.tools.base import ToolContext, tool
from stockade.tools.paths import fs_error, resolve_path
from stockade.tools.toolset_schemas import WRITE_SCHEMA

__all__ = ["write"]


@tool(
    name="write",
    description="Write a file, creating parent directories as needed.",
    input_schema=WRITE_SCHEMA,
)
def write(file_path: str, content: str, ctx: ToolContext) -> str:
    """Write a file, creating parent directories as needed."""
    target = resolve_path(ctx, file_path, "write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Bytes, so no newline translation happens.
        target.write_bytes(content.encode("utf-8"))
    except OSError as exc:
        raise fs_error("write", file_path, exc) from exc
    return f"wrote {len(content)} bytes to {file_path}"
