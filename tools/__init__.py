"""stockade.tools: the tool model (`@tool`, `Tool`, `ToolError`, `ToolContext`), tool references,
command tools and the sandboxed `agent_toolset_20260401` (`stockade.tools.builtin`).

Errors: one tree rooted at `ToolError` (`stockade.tools.errors`): `ToolError` itself is what a tool
raises to return deliberate error content; `BadResult` (a tool returned junk) and `ToolLoadError` (a
tool reference could not be loaded) are its kinds.

Imports only the stdlib and msgspec (psutil optionally), never `anthropic`, `stockade.sandbox` or
`stockade.supervisor`: a worker imports it before running tools.
"""

from stockade.tools.base import BadResult, FunctionTool, Tool, ToolContext, ToolError, tool
from stockade.tools.registry import ToolLoadError, load_tools

__all__ = [
    "BadResult",
    "FunctionTool",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolLoadError",
    "load_tools",
    "tool",
]
