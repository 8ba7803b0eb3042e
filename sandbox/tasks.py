"""Ending the tasks one owns: cancel them, wait for them, and never swallow the owner's own cancellation.

An owner cleaning up drops its tasks' results and errors (a cancelled child raises `CancelledError`
too), but a `CancelledError` aimed at the owner itself must still propagate: `settle` and
`cancel_and_wait` raise it once the tasks have ended if the running task is being cancelled
(`asyncio.current_task().cancelling()`). Shared by the supervisor and the sandbox's host side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["cancel_and_wait", "raise_if_cancelling", "settle"]


def raise_if_cancelling() -> None:
    """Raise `CancelledError` if the running task is being cancelled (cleanup caught it on the way)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def settle(*awaitables: Awaitable[Any]) -> None:
    """Wait until each of `awaitables` has ended, dropping their results and errors."""
    if awaitables:
        await asyncio.gather(*awaitables, return_exceptions=True)
    raise_if_cancelling()


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and wait until each has ended, dropping their results and errors."""
    for task in tasks:
        task.cancel()
    await settle(*tasks)
