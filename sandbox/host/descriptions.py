"""Tool descriptions several sandboxes share, so a list of references is described in a worker once.

`stockade serve` gives one `SharedDescriptions` to the sandboxes of all the sessions it serves (which
all have the same references and policies but their workdirs): the first session's sandbox describes
the references in a worker of its own, and every later session reuses that answer instead of
starting, and then retiring, a worker of its own for the same answer. Only a clean description (no
load error) is kept: a reference that failed to load is tried again by the next sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from stockade.sandbox.wire.protocol import Described

__all__ = ["SharedDescriptions"]


class SharedDescriptions:
    """Clean descriptions by reference list; concurrent first askers wait for one description."""

    def __init__(self) -> None:
        self._described: dict[tuple[str, ...], Described] = {}
        self._locks: dict[tuple[str, ...], asyncio.Lock] = {}
        self.described_in_workers = 0
        """How many times a description was asked of a worker (what sharing saves is the rest)."""

    async def get(self, refs: Sequence[str], describe: Callable[[], Awaitable[Described]]) -> Described:
        """The clean description of `refs` kept from before, or `describe()`'s answer (kept if clean)."""
        key = tuple(refs)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (kept := self._described.get(key)) is not None:
                return kept
            self.described_in_workers += 1
            reply = await describe()
            if reply.error is None:
                self._described[key] = reply
            return reply
