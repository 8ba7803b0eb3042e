"""The tools package's error tree, rooted at `ToolError`.

- `ToolError`: raised by a tool to return deliberate error content (a string or content blocks), as
  the SDK's `ToolError` is; the root of every error stockade's tool model raises.
- `BadResult(ToolError)`: a tool returned something that is neither a string nor content blocks (or
  that cannot be sent as JSON); its message is the error text.
- `ToolLoadError(ToolError)`: a tool reference could not be imported or does not name tools.

Whoever catches the subclasses separately (the worker) catches them before `ToolError`: their message,
not their content, is what the agent reads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BadResult", "ToolError", "ToolLoadError"]


class ToolError(Exception):
    """Raised by a tool to return deliberate error content (a string or content blocks)."""

    def __init__(self, content: str | list[dict[str, Any]]) -> None:
        super().__init__(content if isinstance(content, str) else "tool error")
        self.content = content

    def blocks(self) -> list[dict[str, Any]]:
        """The error content as content blocks; an empty error reads "(no output)"."""
        # Imported here: content.py raises BadResult, so it imports this module first.
        from stockade.tools.content import NO_OUTPUT, to_content, well_formed

        if isinstance(self.content, str):
            return [{"type": "text", "text": well_formed(self.content) or NO_OUTPUT}]
        try:
            return to_content("error", self.content)
        except BadResult:
            return [{"type": "text", "text": repr(self.content)}]


class BadResult(ToolError):
    """The tool returned something that is neither a string nor content blocks (or cannot be sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ToolLoadError(ToolError):
    """A tool reference could not be imported or does not name tools."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
