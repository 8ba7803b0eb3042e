"""Tool references: `"module:attr"` names a tool or a list of tools that a worker imports itself.

CONTRACT (used by stockade.sandbox.worker; keep this signature):
- `load_tools(ref: str) -> list[Tool]`: import `module`, take `attr` (a Tool, an SDK beta tool, or a list
  of them) and return them as stockade Tools. Raises `ToolLoadError` with a clear message.
This file is a minimal first version; the tools issue fleshes it out.
"""

from __future__ import annotations

import importlib

from stockade.tools.base import Tool

__all__ = ["ToolLoadError", "load_tools"]


class ToolLoadError(Exception):
    """A tool reference could not be imported or does not name tools."""


def load_tools(ref: str) -> list[Tool]:
    """Import the tools that `ref` ("module:attr") names."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ToolLoadError(f"tool reference {ref!r} is not of the form MODULE:ATTR")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ToolLoadError(f"cannot import {module_name!r} for tool reference {ref!r}: {exc!r}") from exc
    value = getattr(module, attr, None)
    items = value if isinstance(value, list | tuple) else [value]
    if not items or not all(isinstance(item, Tool) for item in items):
        raise ToolLoadError(f"tool reference {ref!r} does not name a tool or a list of tools")
    return list(items)
