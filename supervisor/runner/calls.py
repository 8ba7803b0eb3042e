"""Running calls: one per session thread, at most `max_concurrent_calls` at once (rules I1, J2, E3, M2).

Each call runs in its own task: the loop creates it and hands it to `RunningCalls`, which owns it
(it cancels and awaits what is left in `wait_all`). The sandbox call inside it is a separate task so
that it can be cancelled (the sandbox then kills the worker's tree) while the call's task goes on to
post the "stopped" result. An outer deadline backs up the sandbox's own wall-clock timeout. A
finished call comes up as a value on `finished()`: the loop reads that and acts; nothing here calls
back into the loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from stockade.sandbox.outcome import ToolOutcome
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import cancel_and_wait

__all__ = ["OUTER_DEADLINE_MARGIN_S", "RunningCall", "RunningCalls", "ToolEnd", "outer_deadline_s"]

# The sandbox enforces each call's wall timeout itself (and reports TimedOut with usage); this outer
# deadline only backs it up, so it is longer than the worker's start, the call and the kill's grace.
OUTER_DEADLINE_MARGIN_S = 5.0

ToolEnd = ToolOutcome | Literal["stopped", "timed_out"] | Exception
"""How a sandbox call ended: its outcome, stopped by the supervisor, past the outer deadline, or the
sandbox's own error (it could not run the call at all)."""

log = logging.getLogger(__name__)


def outer_deadline_s(policy: ResourcePolicy) -> float:
    """The supervisor's own bound on one call under `policy`: past every deadline the sandbox keeps,
    so the sandbox always reports its own `TimedOut` first and this fires only if the sandbox hangs."""
    return policy.startup_timeout_s + policy.wall_timeout_s + policy.grace_s + OUTER_DEADLINE_MARGIN_S


@dataclass
class RunningCall:
    """The running call of one thread."""

    call_id: str
    thread: str | None
    stop_requested: bool = False
    tool_task: asyncio.Future[ToolOutcome] | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop the tool (cancelling the sandbox call kills its process tree)."""
        self.stop_requested = True
        if self.tool_task is not None:
            self.tool_task.cancel()


class RunningCalls:
    """The running calls, keyed by thread (`None` is the primary thread); the owner of their tasks."""

    def __init__(self, limit: int | None) -> None:
        self._limit = math.inf if limit is None else limit
        self._by_thread: dict[str | None, RunningCall] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: asyncio.Queue[RunningCall] = asyncio.Queue()

    async def finished(self) -> RunningCall:
        """The next call to finish (its thread, and a slot, are free again)."""
        return await self._finished.get()

    def threads(self) -> set[str | None]:
        return set(self._by_thread)

    def has_room(self) -> bool:
        return len(self._by_thread) < self._limit

    def can_start(self, thread: str | None) -> bool:
        return thread not in self._by_thread and self.has_room()

    def start(self, running: RunningCall, task: asyncio.Task[None]) -> None:
        """Own `task`, the work of call `running` (the caller checked `can_start`); once it has ended,
        `running` comes up on `finished()`."""
        self._by_thread[running.thread] = running
        self._tasks.add(task)
        task.add_done_callback(lambda _: self._end(running, task))

    def _end(self, running: RunningCall, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        del self._by_thread[running.thread]
        self._finished.put_nowait(running)

    def stop_tools_if(self, condition: Callable[[str], bool]) -> None:
        for running in self._by_thread.values():
            finished = running.tool_task is not None and running.tool_task.done()
            if not (running.stop_requested or finished) and condition(running.call_id):
                log.info("tool_stop call_id=%s", running.call_id)
                running.stop()

    async def wait_all(self, timeout_s: float | None = None) -> None:
        """Waits for every call task; after `timeout_s`, or when the waiting task is cancelled, the
        rest are cancelled (their posts abandoned) and awaited: no call task outlives its owner."""
        tasks = set(self._tasks)
        if not tasks:
            return
        try:
            await asyncio.wait(tasks, timeout=timeout_s)
        finally:
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                log.warning("call_abandoned task=%s", task.get_name())
            await cancel_and_wait(*pending)

    @staticmethod
    async def run_tool(
        running: RunningCall, tool: Coroutine[Any, Any, ToolOutcome], deadline_s: float
    ) -> ToolEnd:
        """Run the sandbox call `tool`, bounded by `deadline_s` and by `running.stop()`."""
        task = running.tool_task = asyncio.ensure_future(tool)
        if running.stop_requested:
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=deadline_s)
        if not done:
            await cancel_and_wait(task)
            return "timed_out"
        if task.cancelled():
            return "stopped"
        exc = task.exception()
        if isinstance(exc, Exception):
            return exc
        return task.result()
