"""Small tools for the supervisor tests; the sandbox's workers import them as `sv_tools:NAME`
(the tests put this directory on PYTHONPATH and pass it through the policy)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from stockade.tools.base import ToolError, tool


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
