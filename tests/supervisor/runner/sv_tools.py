"""Small tools for the supervisor tests; the sandbox's workers import them as `sv_tools:NAME`
(the tests put this directory on PYTHONPATH and pass it through the policy)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from stockade.tools.base import Tool, ToolContext, ToolError, tool


@tool
def echo(text: str = "") -> str:
    """Return the text."""
    return text


@tool
def slow(seconds: float = 1.0, mark: str = "") -> str:
    """Sleep, then return "slept"; with `mark`, first write the pid to that file."""
    if mark:
        Path(mark).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"


@tool
def whose_thread(ctx: ToolContext) -> str:
    """Return the call's session thread as the tool sees it (`repr`: `None` is the primary thread)."""
    return repr(ctx.thread)


@tool
def boom(message: str = "kaput") -> str:
    """Raise RuntimeError(message)."""
    raise RuntimeError(message)


@tool
def deliberate(text: str = "no") -> str:
    """Raise a ToolError with the text."""
    raise ToolError(text)


@tool
def blocks() -> list[dict[str, Any]]:
    """Return an empty text block and a tool_reference block."""
    return [{"type": "text", "text": ""}, {"type": "tool_reference", "tool_name": "x"}]


@tool
def big(size: int = 100) -> str:
    """Return `size` characters."""
    return "x" * size


# Content conversion (rule J4) and deliberate differences from the SDK's runner: test_differential.py.


@tool
def surrogate() -> str:
    """Return a string with a lone surrogate."""
    return "a\ud800b"


@tool
def typeless() -> list[dict[str, Any]]:
    """Return a block without a `type`."""
    return [{"no": "type"}]


@tool
def numtext() -> list[dict[str, Any]]:
    """Return a text block whose text is a number."""
    return [{"type": "text", "text": 123}]


@tool
def single() -> dict[str, Any]:
    """Return one block instead of a list."""
    return {"type": "text", "text": "x"}


@tool
def longboom() -> str:
    """Raise an exception with a 10,000-character text."""
    raise RuntimeError("x" * 10_000)


@tool
def rawimage() -> list[dict[str, Any]]:
    """Return an image block whose source data is raw bytes (cannot be sent as JSON)."""
    return [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b"\x89PNG"}}]


@tool
def sysexit() -> str:
    """Raise SystemExit(3)."""
    raise SystemExit(3)


class _UncheckedBlocks(Tool):
    """Hands the worker raw blocks, skipping the worker's conversion: as a compromised worker would."""

    def invoke(self, input: dict[str, Any], ctx: ToolContext) -> list[dict[str, Any]]:
        return [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b"\x89PNG"}}
        ]


rawblocks = _UncheckedBlocks(
    "rawblocks", "Send an image block with raw bytes, unchecked.", {"type": "object"}
)
