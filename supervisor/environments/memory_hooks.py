"""A session's memory sync as its runner sees it: the hooks `stockade run` and `stockade serve` share.

`MemoryHooks(memory, label)` owns the background sync tasks the hooks start: `after_call` restores what
a stopped call may have left missing and syncs when due; `on_event` flushes on `session.status_idle`;
`policy` mounts the stores' folders into a tool's policy. `finish()` is the final sync after a clean
end; `close()` waits for the tasks, then gives every end a bounded push-only flush and disposes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import settle
from stockade.supervisor.environments.memory import FLUSH_TIMEOUT_S, SessionMemory, stopped_call

__all__ = ["MemoryHooks"]

log = logging.getLogger(__name__)


class MemoryHooks:
    """The runner hooks of one session's `SessionMemory` (see the module docstring)."""

    def __init__(self, memory: SessionMemory, label: str) -> None:
        self.memory = memory
        self._label = label
        self._tasks: set[asyncio.Task[None]] = set()

    def policy(self, policy: ResourcePolicy, **changes: Any) -> ResourcePolicy:
        """`policy` with the stores' folders mounted (read-only stores as `read_only_paths`) and
        `changes` applied."""
        return msgspec.structs.replace(
            policy,
            writable_paths=(*policy.writable_paths, *self.memory.writable_roots),
            read_only_paths=(*policy.read_only_paths, *self.memory.read_only_roots),
            **changes,
        )

    def after_call(self, record: Any) -> None:
        """After each call: put back what a stopped call may have removed, sync when due."""
        if stopped_call(record):
            self.memory.restore_missing()
        self._soon(self.memory.sync_if_due())

    def on_event(self, event: Any) -> None:
        """On every session event: an idle session gets a flush."""
        if isinstance(event, dict) and event.get("type") == "session.status_idle":
            self._soon(self._bounded(self.memory.flush(), "idle memory flush"))

    async def finish(self) -> None:
        """The final sync, after a clean end only: it sends deletions without waiting to confirm them."""
        await settle(*self._tasks)
        await self._bounded(self.memory.finish(), "final memory sync")

    async def close(self) -> None:
        """Wait for the hooks' tasks; then a bounded push-only flush (an error or abort gets one too)."""
        try:
            await settle(*self._tasks)
        finally:
            await self._bounded(self.memory.flush(), "memory flush")
            self.memory.dispose()

    def _soon(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bounded(self, work: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await asyncio.wait_for(work, FLUSH_TIMEOUT_S)
        except TimeoutError:
            log.warning("memory_cut_off session=%s pass=%r after_s=%g", self._label, name, FLUSH_TIMEOUT_S)
