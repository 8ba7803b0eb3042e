"""The tool model: `@tool`, `Tool`, `ToolError`, `ToolContext`.

CONTRACT (used by stockade.sandbox.child.worker; keep these signatures):
- `Tool`: `name`, `description`, `input_schema` (JSON schema dict), `invoke(input, ctx) -> list[dict]`
  which returns the result converted to session content blocks (runner rule J4, "(no output)"), or raises
  `ToolError` (deliberate error content, `.blocks()` gives its blocks), `BadResult` (the tool returned
  junk; its message is the error text), or any other exception (the worker reports `repr(exc)`, cut
  to 4,096 characters).
- `ToolContext`: `workdir` (pathlib.Path), `thread` (session thread id or None), `call_id`, and
  optionally `timeout_s` (the call's wall budget, so tools with their own timeout stay inside it) and
  `roots` (directories outside the workdir the file tools may also reach).

Errors (`stockade.tools.errors`): `ToolError` (deliberate, content passed through), `BadResult`
(junk result), and
`ValueError("Invalid arguments for function NAME: ...")` for an input that does not fit the signature.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from stockade.tools.content import to_content
from stockade.tools.errors import BadResult, ToolError
from stockade.tools.schema import Signature, parse_docstring, signature_of

__all__ = ["BadResult", "FunctionTool", "Tool", "ToolContext", "ToolError", "run_sync_or_async", "tool"]


@dataclass(frozen=True)
class ToolContext:
    """Where and for whom a call runs."""

    workdir: Path
    thread: str | None = None
    call_id: str = ""
    timeout_s: float | None = None
    """The call's wall-clock budget, when the sandbox states it."""
    roots: tuple[Path, ...] = ()
    """Directories outside `workdir` that file tools may also reach."""


class Tool:
    """A callable tool with its name, description and input JSON schema.

    `Tool(name, description, input_schema, fn)` wraps `fn(**input)` as is; subclasses override `call`.
    """

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        fn: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.fn = fn

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def call(self, input: dict[str, Any], ctx: ToolContext) -> object:
        """Run the tool and return its raw result (a string, blocks, or None)."""
        if self.fn is None:
            raise NotImplementedError(f"tool {self.name!r} has no function")
        return run_sync_or_async(self.fn(**input))

    def invoke(self, input: dict[str, Any], ctx: ToolContext) -> list[dict[str, Any]]:
        """Call the tool with `input`; returns session content blocks (rule J4)."""
        return to_content(self.name, self.call(input, ctx))

    def close(self) -> None:
        """Release what the tool holds (processes, files); the worker calls it once at exit."""


class FunctionTool(Tool):
    """A tool made by `@tool` from a sync or async function.

    Its parameters are read at once (a function no input can fit fails where it is decorated); its
    description and schema only when first asked for: a worker that only runs the tool, as a fresh
    one per call does, never reads the docstring or builds the schema of each tool of its module."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
    ) -> None:
        self.signature: Signature = signature_of(fn, ToolContext)
        self.name = name or fn.__name__
        self.fn = fn
        # Given ones shadow the lazy properties below (instance attributes win over them).
        if description is not None:
            self.description = description
        if input_schema is not None:
            self.input_schema = input_schema

    @functools.cached_property
    def _docstring(self) -> tuple[str, dict[str, str]]:
        return parse_docstring(self.fn.__doc__ if self.fn is not None else None)

    @functools.cached_property
    def description(self) -> str:  # type: ignore[override]
        """The docstring's description."""
        return self._docstring[0]

    @functools.cached_property
    def input_schema(self) -> dict[str, Any]:  # type: ignore[override]
        """The input's JSON schema, from the signature and the docstring's parameter descriptions."""
        return self.signature.input_schema(self._docstring[1])

    def call(self, input: dict[str, Any], ctx: ToolContext) -> object:
        """Validate `input` against the signature, then call the function (with `ctx` if it asks)."""
        if not isinstance(input, dict):
            raise TypeError(f"Input must be a dictionary, got {type(input).__name__}")
        kwargs = self.signature.validate(self.name, input)
        if self.signature.ctx_param is not None:
            kwargs[self.signature.ctx_param] = ctx
        assert self.fn is not None
        return run_sync_or_async(self.fn(**kwargs))


def run_sync_or_async(result: object) -> object:
    """`result`, or what it resolves to when it is awaitable (run on a fresh event loop)."""
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None, input_schema: dict[str, Any] | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool from a function: `@tool` or `@tool(name=..., description=..., input_schema=...)`.

    The schema comes from the type hints and the docstring's `Args:` section (unless `input_schema`
    is given; inputs are still checked against the signature); a parameter annotated `ToolContext`
    receives the call's context and is not part of the schema.
    """
    if fn is not None:
        return FunctionTool(fn, name, description, input_schema)

    def make(func: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(func, name, description, input_schema)

    return make
