"""Sandboxed tools for the SDK's Messages API tool runner (`client.beta.messages.tool_runner`).

`sandboxed(tools, policy=..., policies=...)` gives tool objects that the SDK's runner accepts like its own
(`.name`, `.to_dict()`, `.call(input)`), but whose calls run in stockade workers under per-tool policies.
The user's loop does not change:

    with sandboxed(["mytools:search"]) as tools:
        runner = client.beta.messages.tool_runner(model=..., tools=tools, messages=...)
        for message in runner:
            ...

`with` gives the sync flavour (the async sandbox runs on a background event-loop thread that the context
owns); `async with` gives the async flavour, on the caller's loop. All tools of one context share one
sandbox, so one set of worker pools; leaving the context — also by `break` or an exception — closes the
sandbox, which kills and reaps every worker.

A timeout, crash or over-limit becomes an `is_error` tool result with the same content the session runner
posts for it (`ToolOutcome.content()`), by raising the SDK's `ToolError`.

Errors: `SandboxedToolsError` (a tool object that no worker can import, or tools used outside their
context); sandbox errors from `describe()` propagate out of `with`/`async with` unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import threading
from collections.abc import Coroutine, Iterable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, TypeVar, cast

from anthropic.lib.tools import (
    BetaAsyncBuiltinFunctionTool,
    BetaBuiltinFunctionTool,
    BetaFunctionToolResultType,
    ToolError,
)
from anthropic.types.beta import BetaToolParam
from stockade.sandbox import CallRequest, Sandbox, ToolInfo
from stockade.sandbox.outcome import TimedOut, ToolOutcome
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.errors import SupervisorError
from stockade.supervisor.runner.calls import OUTER_DEADLINE_MARGIN_S, outer_deadline_s
from stockade.tools.registry import ToolLoadError, split_ref

__all__ = [
    "AsyncSandboxedTool",
    "Sandboxed",
    "SandboxedTool",
    "SandboxedToolsError",
    "sandboxed",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

LOOP_THREAD_JOIN_S = 10.0
"""How long closing waits for the background event-loop thread to finish after its loop stops."""
CLOSE_TIMEOUT_S = 30.0
"""Bound on closing the sandbox from the sync flavour; the sandbox's own kills (TERM, grace, KILL of each
tree) finish well inside it."""
"""How long closing waits for the background event-loop thread to finish after its loop stops."""

_call_ids = itertools.count(1)


class SandboxedToolsError(SupervisorError):
    """Tools that cannot be sandboxed as given, or sandboxed tools used outside their context."""


def sandboxed(
    tools: Iterable[str | object],
    *,
    policy: ResourcePolicy | None = None,
    policies: Mapping[str, ResourcePolicy] | None = None,
) -> Sandboxed:
    """Tools for the Messages tool runner whose calls run in stockade workers.

    `tools` are `"module:attr"` references and/or tool objects defined at module level in an importable
    module (a stockade `Tool` or an SDK `@beta_tool`). `policies` maps a tool name to its policy; other
    tools run under `policy` (default: `ResourcePolicy()`). Use the result as a context manager.
    """
    refs = [_ref_of(item) for item in tools]
    return Sandboxed(refs, policy or ResourcePolicy(), dict(policies or {}))


class _Backend:
    """One open sandbox and the tools it described: what every tool of a context calls into."""

    def __init__(self, sandbox: Sandbox, infos: list[ToolInfo]) -> None:
        self.sandbox = sandbox
        self.infos = infos
        self.open = True

    def request(self, info: ToolInfo, input: object) -> CallRequest:
        if not self.open:
            raise SandboxedToolsError(f"sandboxed tool '{info.name}' called after its context was closed")
        if not isinstance(input, dict):
            raise TypeError(f"Input must be a dictionary, got {type(input).__name__}")
        return CallRequest(call_id=f"msg-{next(_call_ids)}", name=info.name, ref=info.ref, input=input)

    def outer_deadline_s(self, name: str) -> float:
        """The adapter's own bound on one call of `name`: longer than every deadline the sandbox keeps."""
        return outer_deadline_s(self.sandbox.policy_for(name))


def _result(outcome: ToolOutcome) -> BetaFunctionToolResultType:
    """A finished call's result blocks, or the SDK's ToolError carrying the outcome's error content."""
    log.info(
        "messages_tool_call tool=%s outcome=%s wall_s=%.3f", outcome.tool, outcome.kind, outcome.usage.wall_s
    )
    # The outcome's blocks are the tool's own content blocks, which the SDK types as its block params.
    content = cast(BetaFunctionToolResultType, outcome.content())
    if outcome.is_error:
        raise ToolError(content)
    return content


def _definition(info: ToolInfo) -> BetaToolParam:
    return {"name": info.name, "description": info.description, "input_schema": info.input_schema}


class SandboxedTool(BetaBuiltinFunctionTool):
    """A sync tool for `Anthropic().beta.messages.tool_runner`; `call` blocks until the worker is done."""

    def __init__(self, info: ToolInfo, backend: _Backend, loop: asyncio.AbstractEventLoop) -> None:
        self.info = info
        self._backend = backend
        self._loop = loop

    def to_dict(self) -> BetaToolParam:
        return _definition(self.info)

    def call(self, input: object) -> BetaFunctionToolResultType:
        request = self._backend.request(self.info, input)
        deadline_s = self._backend.outer_deadline_s(self.info.name)
        try:
            # A Ctrl-C here cancels the call, and the sandbox kills its worker on cancellation.
            outcome = _wait(self._backend.sandbox.run(request), self._loop, deadline_s)
        except TimeoutError:
            outcome = TimedOut(tool=self.info.name, timeout_s=deadline_s)
        return _result(outcome)


class AsyncSandboxedTool(BetaAsyncBuiltinFunctionTool):
    """An async tool for `AsyncAnthropic().beta.messages.tool_runner`, run on the caller's event loop."""

    def __init__(self, info: ToolInfo, backend: _Backend) -> None:
        self.info = info
        self._backend = backend

    def to_dict(self) -> BetaToolParam:
        return _definition(self.info)

    async def call(self, input: object) -> BetaFunctionToolResultType:
        request = self._backend.request(self.info, input)
        deadline_s = self._backend.outer_deadline_s(self.info.name)
        try:
            async with asyncio.timeout(deadline_s):
                outcome = await self._backend.sandbox.run(request)
        except TimeoutError:
            outcome = TimedOut(tool=self.info.name, timeout_s=deadline_s)
        return _result(outcome)


class Sandboxed:
    """The tools of one sandbox, as a context manager: `with` gives sync tools, `async with` async ones."""

    def __init__(self, refs: list[str], default: ResourcePolicy, policies: dict[str, ResourcePolicy]) -> None:
        self.refs = refs
        self._default = default
        self._policies = policies
        self._stack: AsyncExitStack | None = None
        self._backend: _Backend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _open(self) -> _Backend:
        if self._stack is not None:
            raise SandboxedToolsError("this sandboxed() context is already open")
        stack = AsyncExitStack()
        try:
            sandbox = await stack.enter_async_context(Sandbox(policies=self._policies, default=self._default))
            infos = await sandbox.describe(self.refs)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._backend = _Backend(sandbox, infos)
        log.info("messages_sandbox_open tools=%s", ",".join(info.name for info in infos))
        return self._backend

    async def _close(self) -> None:
        stack, backend = self._stack, self._backend
        self._stack = self._backend = None
        if backend is not None:
            backend.open = False
        if stack is not None:
            await stack.aclose()
            log.info("messages_sandbox_closed")

    async def __aenter__(self) -> list[AsyncSandboxedTool]:
        backend = await self._open()
        return [AsyncSandboxedTool(info, backend) for info in backend.infos]

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    def __enter__(self) -> list[SandboxedTool]:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="stockade-messages-loop", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            # Opening starts a worker and imports the tools in it: bounded by the startup timeout.
            backend = _wait(self._open(), loop, self._default.startup_timeout_s + OUTER_DEADLINE_MARGIN_S)
        except BaseException:
            self._stop_loop()
            raise
        return [SandboxedTool(info, backend, loop) for info in backend.infos]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._loop is not None:
                _wait(self._close(), self._loop, CLOSE_TIMEOUT_S)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(LOOP_THREAD_JOIN_S)
        if not thread.is_alive():
            loop.close()


def _wait(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, timeout_s: float) -> T:
    """Run `coro` on the background `loop` and wait for it, at most `timeout_s` (then it is cancelled)."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout=timeout_s)
    except BaseException:
        future.cancel()
        raise


def _ref_of(item: str | object) -> str:
    """The `"module:attr"` reference a worker imports to get `item`."""
    if isinstance(item, str):
        try:
            split_ref(item)
        except ToolLoadError as exc:
            raise SandboxedToolsError(str(exc)) from None
        return item
    func = getattr(item, "fn", None) or getattr(item, "func", None)
    module_name = getattr(func, "__module__", None) or type(item).__module__
    module = sys.modules.get(module_name)
    if module_name == "__main__" and module is not None and module.__spec__ is not None:
        module_name = module.__spec__.name  # run with `python -m`: the worker imports it by that name
    for attr, value in vars(module).items() if module is not None else ():
        if value is item and module_name != "__main__":
            return f"{module_name}:{attr}"
    raise SandboxedToolsError(
        f"cannot sandbox {item!r}: a worker imports its tools, so define the tool at module level in an "
        "importable module, or pass a 'module:attr' reference"
    )
