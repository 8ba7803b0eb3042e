"""The tool model: `@tool`, `Tool`, `ToolError`, `ToolContext`.

CONTRACT (used by stockade.sandbox.worker; keep these signatures):
- `Tool`: `name`, `description`, `input_schema` (JSON schema dict), `invoke(input, ctx) -> list[dict]`
  which returns the result converted to session content blocks (runner rule J4, "(no output)"), or raises
  `ToolError` (deliberate error content, `.blocks()` gives its blocks), `BadResult` (the tool returned
  junk; its message is the error text), or any other exception (the worker reports `repr(exc)`).
- `ToolContext`: `workdir` (pathlib.Path), `thread` (session thread id or None), `call_id`.
This file is a minimal first version; the tools issue fleshes it out.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BadResult", "Tool", "ToolContext", "ToolError", "tool"]


class BadResult(Exception):
    """The tool returned something that is neither a string nor content blocks."""


class ToolError(Exception):
    """Raised by a tool to return deliberate error content (a string or content blocks)."""

    def __init__(self, content: str | list[dict[str, Any]]) -> None:
        super().__init__(content if isinstance(content, str) else "tool error")
        self.content = content

    def blocks(self) -> list[dict[str, Any]]:
        """The error content as content blocks."""
        if isinstance(self.content, str):
            return [{"type": "text", "text": self.content}]
        return self.content


@dataclass(frozen=True)
class ToolContext:
    """Where and for whom a call runs."""

    workdir: Path
    thread: str | None = None
    call_id: str = ""


@dataclass(frozen=True)
class Tool:
    """A callable tool with its name, description and input JSON schema."""

    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]

    def invoke(self, input: dict[str, Any], ctx: ToolContext) -> list[dict[str, Any]]:
        """Call the tool with `input` as keyword arguments; returns content blocks."""
        result = self.fn(**input)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        if isinstance(result, str):
            return [{"type": "text", "text": result or "(no output)"}]
        raise BadResult(f"tool '{self.name}' returned neither a string nor content blocks")


async def _await(awaitable: Any) -> Any:
    return await awaitable


def tool(fn: Callable[..., Any]) -> Tool:
    """Make a tool from a function (minimal: every parameter is a string)."""
    params = inspect.signature(fn).parameters
    schema = {"type": "object", "properties": {n: {"type": "string"} for n in params}, "required": list(params)}
    return Tool(fn.__name__, inspect.getdoc(fn) or "", schema, fn)
