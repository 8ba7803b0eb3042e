"""Tool references: `"module:attr"` names a tool or a list of tools that a worker imports itself.

CONTRACT (used by stockade.sandbox.child.worker; keep this signature):
- `load_tools(ref: str) -> list[Tool]`: import `module`, take `attr` (a Tool, an SDK beta tool, or a list
  of them) and return them as stockade Tools. Raises `ToolLoadError` with a clear message.

SDK tools (`anthropic.beta_tool` / `beta_async_tool` objects) are recognised by duck typing — an object
with `name`, `to_dict()` and `call(input)` — so this module never imports `anthropic`. Their own
`ToolError` is recognised by class name and its `content` passes through as deliberate error content.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from stockade.tools.base import Tool, ToolContext, run_sync_or_async
from stockade.tools.errors import ToolError, ToolLoadError

__all__ = ["SdkTool", "ToolLoadError", "as_tool", "load_tools", "split_ref"]

log = logging.getLogger(__name__)


class SdkTool(Tool):
    """A tool object of the `anthropic` SDK (sync or async), adapted to the stockade `Tool` model."""

    def __init__(self, sdk_tool: Any) -> None:
        spec = sdk_tool.to_dict()
        super().__init__(spec["name"], spec.get("description", ""), dict(spec.get("input_schema", {})))
        self.sdk_tool = sdk_tool

    def call(self, input: dict[str, Any], ctx: ToolContext) -> object:
        """Call the SDK tool; its `ToolError` becomes ours, with the same content."""
        try:
            return run_sync_or_async(self.sdk_tool.call(input))
        except Exception as exc:
            if type(exc).__name__ == "ToolError" and hasattr(exc, "content"):
                content = exc.content
                raise ToolError(content if isinstance(content, str) else list(content)) from exc
            raise

    def close(self) -> None:
        """Run the SDK tool's cleanup: `aclose`/`close` and its entered context manager, if any."""
        closer = getattr(self.sdk_tool, "aclose", None) or getattr(self.sdk_tool, "close", None)
        manager = getattr(self.sdk_tool, "_context_manager", None)
        exits = [closer] if callable(closer) else []
        if manager is not None:
            aexit = getattr(manager, "__aexit__", None)
            exits.append(lambda: (aexit or manager.__exit__)(None, None, None))
        for step in exits:
            try:
                run_sync_or_async(step())
            except Exception as exc:
                log.warning("tool_close_failed tool=%s error=%r", self.name, exc)


def is_sdk_tool(value: object) -> bool:
    """True for objects shaped like the SDK's function tools."""
    return all(callable(getattr(value, attr, None)) for attr in ("to_dict", "call")) and isinstance(
        getattr(value, "name", None), str
    )


def as_tool(value: object) -> Tool | None:
    """`value` as a stockade Tool, or None when it is not a tool."""
    if isinstance(value, Tool):
        return value
    if is_sdk_tool(value):
        return SdkTool(value)
    return None


def split_ref(ref: str) -> tuple[str, str]:
    """The module and attribute of a tool reference; `ToolLoadError` unless it reads MODULE:ATTR."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ToolLoadError(f"tool reference {ref!r} is not of the form MODULE:ATTR")
    return module_name, attr


def load_tools(ref: str) -> list[Tool]:
    """Import the tools that `ref` ("module:attr") names."""
    module_name, attr = split_ref(ref)
    value = getattr(_import(module_name, ref), attr, _MISSING)
    if value is _MISSING:
        raise ToolLoadError(f"tool reference {ref!r}: module {module_name!r} has no attribute {attr!r}")
    items = list(value) if isinstance(value, list | tuple) else [value]
    tools = [as_tool(item) for item in items]
    bad = [repr(item) for item, converted in zip(items, tools, strict=True) if converted is None]
    if not items or bad:
        what = ", ".join(bad) if bad else "an empty list"
        raise ToolLoadError(f"tool reference {ref!r} does not name a tool or a list of tools (got {what})")
    return [t for t in tools if t is not None]


_MISSING = object()


def _import(module_name: str, ref: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise ToolLoadError(f"tool reference {ref!r}: no module named {module_name!r}") from exc
        raise ToolLoadError(f"tool reference {ref!r}: importing {module_name!r} raised {exc!r}") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}:{exc.offset}"
        raise ToolLoadError(f"tool reference {ref!r}: {where}: {exc.msg}: fix the module's syntax") from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ToolLoadError(f"tool reference {ref!r}: importing {module_name!r} raised {exc!r}") from exc
