"""The `read` tool: a UTF-8 text file (whole or a 1-based line range), or an image/PDF as a content block.

Results match the SDK's reference `read`: text as stored (no line-number prefixes), caps that name the
way out (`view_range`), images and PDFs as base64 `image`/`document` blocks.
"""

from __future__ import annotations

import base64
from pathlib import Path
from stat import S_ISREG
from typing import Any

from stockade.tools.base import ToolContext, ToolError, tool
from stockade.tools.paths import fs_error, resolve_path
from stockade.tools.toolset_schemas import READ_SCHEMA

__all__ = ["MAX_IMAGE_BASE64_BYTES", "MAX_PDF_BYTES", "MAX_READ_BYTES", "read"]

MAX_READ_BYTES = 110_000
"""A longer result would be cut by the API without saying how to read the rest."""
MAX_IMAGE_BASE64_BYTES = 5 * 1024 * 1024
"""The API's per-image limit applies to the encoded form."""
MAX_PDF_BYTES = 20 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024
BINARY_MEDIA_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
}


@tool(name="read", description="Read a file rooted at the working directory.", input_schema=READ_SCHEMA)
def read(file_path: str, ctx: ToolContext, view_range: list[int] | None = None) -> str | list[dict[str, Any]]:
    """Read a file rooted at the working directory."""
    target = resolve_path(ctx, file_path, "read")
    if view_range and len(view_range) != 2:
        raise ToolError("read: view_range must be [start_line, end_line]")
    try:
        size = _regular_file_size(target, file_path)
        media_type = BINARY_MEDIA_TYPES.get(target.suffix.lower())
        if media_type is not None:
            if view_range:
                raise ToolError("read: view_range is not supported for image/PDF files")
            return [_binary_block(target, file_path, size, media_type)]
        if size > MAX_READ_BYTES:
            if not view_range:
                raise ToolError(
                    f"read: {file_path} is {size} bytes, exceeds {MAX_READ_BYTES}-byte limit. "
                    "Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
                )
            return _line_range(target, file_path, view_range[0], view_range[1])
        text = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"read: {file_path}: not valid UTF-8 text "
            "(binary files are only supported for image/PDF extensions)"
        ) from exc
    except OSError as exc:
        raise fs_error("read", file_path, exc) from exc
    if not view_range:
        return text
    lines = text.split("\n")
    end = view_range[1] if view_range[1] > 0 else len(lines)
    return "\n".join(lines[max(0, view_range[0] - 1) : end])


def _regular_file_size(target: Path, file_path: str) -> int:
    """The size of `target`, checked before any open: a FIFO would block, a huge file would not fit."""
    st = target.stat()
    if not S_ISREG(st.st_mode):
        raise ToolError(f"read: {file_path}: not a regular file")
    return st.st_size


def _binary_block(target: Path, file_path: str, size: int, media_type: str) -> dict[str, Any]:
    is_pdf = media_type == "application/pdf"
    limit = MAX_PDF_BYTES if is_pdf else MAX_IMAGE_BASE64_BYTES // 4 * 3
    if size > limit:
        raise ToolError(f"read: {file_path} is {size} bytes, exceeds {limit}-byte limit for image/PDF files.")
    data = base64.standard_b64encode(target.read_bytes()).decode("ascii")
    return {"type": "document" if is_pdf else "image", "source": _b64(media_type, data)}


def _b64(media_type: str, data: str) -> dict[str, str]:
    return {"type": "base64", "media_type": media_type, "data": data}


def _line_range(target: Path, file_path: str, start_line: int, end_line: int) -> str:
    """Lines `[start_line, end_line]` (1-based, inclusive; end <= 0: to the end) of a big file, streamed."""
    first = max(0, start_line - 1)
    stop = end_line if end_line > 0 else None
    picked = bytearray()
    with target.open("rb") as f:
        for number, line in enumerate(f):
            if stop is not None and number >= stop:
                break
            if number >= first:
                # The range's last line loses its newline; a range past the end keeps the file's last one.
                picked += line.removesuffix(b"\n") if number + 1 == stop else line
                if len(picked) > MAX_READ_BYTES:
                    raise _range_too_large(file_path, start_line, end_line, first, stop)
    return picked.decode("utf-8")


def _range_too_large(
    file_path: str, start_line: int, end_line: int, first: int, stop: int | None
) -> ToolError:
    if stop is not None and stop - first == 1:
        return ToolError(
            f"read: line {first + 1} of {file_path} alone exceeds {MAX_READ_BYTES}-byte limit. "
            "The read tool cannot return part of a line, so view_range cannot narrow this further."
        )
    return ToolError(
        f"read: view_range [{start_line}, {end_line}] of {file_path} exceeds {MAX_READ_BYTES}-byte limit. "
        "Narrow the view_range to read a smaller portion."
    )
